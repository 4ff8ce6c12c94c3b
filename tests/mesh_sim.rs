//! The mesh under the deterministic simulator: random schedules never overshoot the declared
//! bound and never deny a request the oracle had room for, and the README scenarios meet
//! their targets. All runs are simulated time (seeded), so nothing here depends on the
//! machine's speed.

use std::time::Duration;

use proptest::prelude::*;
use ratemesh::sim::{self, Crash, Drain, Partition, SimConfig, SimReport, Traffic};
use ratemesh::{Algorithm, Policy};

fn policy(algorithm: u8, limit: u64, window_ms: u64) -> Policy {
    let window = Duration::from_millis(window_ms);
    let rate = (limit * 1000).div_ceil(window_ms);
    match algorithm % 4 {
        0 => Policy::sliding_window(limit, window),
        1 => Policy::fixed_window(limit, window),
        2 => Policy::token_bucket(rate, Duration::from_secs(1), limit),
        _ => Policy::gcra(rate, Duration::from_secs(1), limit),
    }
    .unwrap()
}

fn traffic(index: u8) -> Traffic {
    match index % 7 {
        0 => Traffic::Uniform,
        1 => Traffic::OneNode,
        2 => Traffic::MovingHotspot {
            every_ns: 700_000_000,
            permille: 900,
        },
        3 => Traffic::SynchronizedBurst,
        4 => Traffic::Poisson,
        5 => Traffic::Bursty,
        _ => Traffic::Zipf {
            exponent_milli: 1000,
        },
    }
}

/// What every run must satisfy, whatever the schedule.
fn check_invariants(config: &SimConfig, report: &SimReport) -> Result<(), TestCaseError> {
    let bound = report.declared_bound;
    let allowed = bound.total() + 1e-9;
    prop_assert!(
        report.policy_overshoot <= allowed,
        "policy overshoot {} above the declared {} ({:?}) in {:?}",
        report.policy_overshoot,
        allowed,
        bound,
        config
    );
    prop_assert!(
        !report.double_authority,
        "two nodes could grant from one key at once in {:?}",
        config
    );
    prop_assert_eq!(
        report.frames_dropped,
        0,
        "honest peers' frames were refused"
    );
    prop_assert!(report.admitted <= report.requests * config.max_cost);
    // The busiest key's share of the load: a Zipf law puts more than 1/keys on the first.
    let top_share = match config.traffic {
        Traffic::Zipf { exponent_milli } => {
            let s = f64::from(exponent_milli) / 1000.0;
            1.0 / (1..=config.keys)
                .map(|k| 1.0 / (k as f64).powf(s))
                .sum::<f64>()
        }
        _ => 1.0 / config.keys as f64,
    };
    let under_the_limit = config.demand * top_share * (config.keys as f64) <= 1.0;
    // Below the limit, whatever the faults (loss, partitions and heals, crashes, restarts,
    // drains), an owner never refuses what it has room for: a request denied with room was
    // denied because its wait reached `max_wait`, its node was down, or its answer came at
    // its window's end; or the room was what the leases of nodes its owner could not hear
    // held (docs/overshoot.md, "When false denials can happen"). A bucket, without loss and
    // with the default gossip budget: a late report holds back the refill its authority
    // gives back for tokens spent before it.
    let default_budget =
        config.gossip_budget_bytes_per_s == SimConfig::new(config.policy).gossip_budget_bytes_per_s;
    let bucket = matches!(
        config.policy.algorithm(),
        Algorithm::TokenBucket | Algorithm::Gcra
    );
    if under_the_limit && (!bucket || (config.loss == 0.0 && default_budget)) {
        prop_assert_eq!(
            report.refused_with_room,
            0,
            "refused with room in {:?}: {:?}",
            config,
            report
        );
    }
    // Without loss or faults, and with a `max_wait` that covers a round and two round trips
    // (a want, a recall, their answers; twice that with drains, whose keys are asked again
    // of their new owners), the mesh never denies a request while there is room for it with
    // a round's worth of arrivals to spare, by the oracle's history and by the mesh's own
    // admissions.
    // Drains and starts are ordinary: nothing changes for them. (With clocks further apart
    // than a twentieth of a window, not measurable: a key's windows follow its first owner's
    // clock, and after a drain another's clock may run them, apart from the oracle's.)
    let trip = config.latency_ns + config.jitter_ns;
    if config.loss == 0.0
        && config.max_wait_ns
            >= (config.gossip_interval_ns + 4 * trip) * if config.drains.is_empty() { 1 } else { 2 }
        && config.partition.is_none()
        && config.crashes.is_empty()
        && (config.drains.is_empty() || 20 * config.skew_ns < config.policy.window_ns())
        && default_budget
        && under_the_limit
    {
        prop_assert!(
            report.false_denials_with_room == 0,
            "denied with room in {:?}: {:?}",
            config,
            report
        );
    }
    // Once drains and starts, or a crash, are over, what the cluster still admits for a key
    // is what one central limiter that admitted what it admitted would have: within 1% of
    // the limit, and a crash may lose what the crashed node's lease held. Measured where
    // every key's demand exhausts its windows (a denial before that says nothing of the
    // budget), without loss (a late answer at a window's end looks like lost budget: those
    // are left to the false-denial checks), with clocks within a twentieth of a window of
    // each other (further apart, the oracle's windows and the cluster's part far enough that
    // a window's last decision is not the budget's), and where the cluster can grant in the
    // end: the nodes down at the end leave a majority of the members standing (a clean
    // leave lowers the count of members). A healed partition's budget has tests of its own
    // (`tests/node_membership.rs`, and the partition tests below).
    let exhausting = config.demand >= 1.2 && !matches!(config.traffic, Traffic::Zipf { .. });
    let left = config
        .drains
        .iter()
        .filter(|d| d.restart_ns.is_none())
        .count();
    let back_in_time =
        |restart: Option<u64>| restart.is_some_and(|r| r + 1_000_000_000 < config.duration_ns);
    let down = config
        .crashes
        .iter()
        .filter(|c| !back_in_time(c.restart_ns))
        .count();
    let members = config.nodes - left;
    let majority_up = members > down && members - down > members / 2;
    let close_clocks = 20 * config.skew_ns < config.policy.window_ns();
    if config.partition.is_none()
        && (config.drains.is_empty() || config.crashes.is_empty())
        && close_clocks
        && exhausting
        && majority_up
        && config.loss == 0.0
    {
        prop_assert!(
            report.budget_lost <= 0.01 + report.crash_loss + 1e-9,
            "budget lost {} (crash loss {}) in {:?}: {:?}",
            report.budget_lost,
            report.crash_loss,
            config,
            report
        );
    }
    // After a heal with a second to spare, the nodes agree on every key's owner.
    if let Some(p) = config.partition
        && p.heal_ns + 1_000_000_000 < config.duration_ns
        && config.crashes.is_empty()
    {
        prop_assert!(
            report.convergence_ms_after_heal.is_some(),
            "no convergence after the heal in {:?}",
            config
        );
    }
    Ok(())
}

/// The random schedules' configuration: 64 cases (`RATEMESH_SIM_CASES` or `PROPTEST_CASES`
/// for more), drawn from `RATEMESH_SIM_SEED` or a fresh seed, printed with any failure
/// (replay it with that variable). A failure's case is saved in
/// `tests/mesh_sim.proptest-regressions` and replayed first by every run once committed.
fn schedules() -> ProptestConfig {
    use std::hash::{BuildHasher, Hasher};
    let seed = std::env::var("RATEMESH_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u8(0);
            h.finish()
        });
    eprintln!("mesh_sim schedules from seed {seed} (replay: RATEMESH_SIM_SEED={seed})");
    let cases = ["RATEMESH_SIM_CASES", "PROPTEST_CASES"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(schedules())]

    /// Random clusters, links, faults, traffic and gossip budgets: the measured overshoot (in
    /// the policy's own terms) never exceeds the declared bound, and without faults (or a
    /// budget that holds items back) nothing the oracle had room for is denied.
    #[test]
    fn overshoot_never_exceeds_the_declared_bound(
        nodes in 2usize..=6,
        gossip_ms in 5u64..=40,
        latency_ms in 0u64..=15,
        jitter_ms in 0u64..=10,
        lossy in prop::bool::weighted(0.5),
        loss in 0.0f64..0.3,
        duplication in 0.0f64..0.2,
        skew_ms in prop::sample::select(vec![0u64, 0, 7, 300, 1000]),
        algorithm in 0u8..4,
        traffic_index in 0u8..7,
        demand in 0.3f64..4.0,
        max_cost in 1u64..=20,
        keys in 1u64..=3,
        limit in 20u64..=400,
        window_ms in 200u64..=1000,
        partition in prop::option::weighted(0.2, (0.3f64..1.5, 0.2f64..1.5, 1usize..=2)),
        crash in prop::option::weighted(0.2, (0.2f64..2.0, prop::option::of(0.05f64..1.5))),
        drain in prop::option::weighted(0.3, (0.2f64..2.0, prop::option::of(0.05f64..1.0), 0usize..3)),
        budget in prop::option::weighted(0.2, 10_000u64..=300_000),
        first_credit in prop::sample::select(vec![0u64, 0, 1, 2]),
        seed in any::<u64>(),
    ) {
        let mut c = SimConfig::new(policy(algorithm, limit, window_ms));
        c.nodes = nodes;
        c.gossip_interval_ns = gossip_ms * 1_000_000;
        c.latency_ns = latency_ms * 1_000_000;
        c.jitter_ns = jitter_ms * 1_000_000;
        c.loss = if lossy { loss } else { 0.0 };
        c.duplication = duplication;
        c.skew_ns = skew_ms * 1_000_000;
        c.traffic = traffic(traffic_index);
        c.demand = demand;
        c.max_cost = max_cost.min(limit / 2).max(1);
        c.keys = keys;
        c.duration_ns = 3_000_000_000;
        c.first_credit = first_credit;
        c.seed = seed;
        // Half the schedules split their rounds into slices of one or two keys, as the
        // node's driver does with larger slices (drawn from the seed, so the schedules are
        // the same as without).
        c.round_slice_keys = [0, 0, 1, 2][(seed >> 32) as usize % 4];
        if let Some(budget) = budget {
            // Tight enough to hold items back in most schedules.
            c.gossip_budget_bytes_per_s = budget;
        }
        if let Some((at, length, minority)) = partition {
            c.partition = Some(Partition {
                at_ns: (at * 1e9) as u64,
                heal_ns: ((at + length) * 1e9) as u64,
                minority: minority.min(nodes - 1),
            });
        }
        if let Some((at, down, rank)) = drain {
            // The first key's owner, its successor, or the node after.
            let node = sim::ranked(nodes, 0)[rank.min(nodes - 1)];
            c.drains.push(Drain {
                node,
                at_ns: (at * 1e9) as u64,
                restart_ns: down.map(|d| ((at + d) * 1e9) as u64 + sim::DRAIN_STOP_NS),
            });
        }
        // A crash or a partition while a node drains or is away after a drain is a double
        // fault the declared bound does not cover yet (a key's owner and the node that
        // would take it over both gone at once): drains get schedules of their own.
        if drain.is_some() {
            c.partition = None;
        }
        if let Some((at, down)) = crash.filter(|_| drain.is_none()) {
            c.crashes.push(Crash {
                node: (seed % nodes as u64) as usize,
                at_ns: (at * 1e9) as u64,
                restart_ns: down.map(|d| ((at + d) * 1e9) as u64),
            });
        }
        let report = sim::run(&c);
        check_invariants(&c, &report)?;
    }
}

fn window(limit: u64, window_ms: u64) -> Policy {
    Policy::sliding_window(limit, Duration::from_millis(window_ms)).unwrap()
}

fn config(policy: Policy, nodes: usize, traffic: Traffic, demand: f64) -> SimConfig {
    let mut c = SimConfig::new(policy);
    c.nodes = nodes;
    c.traffic = traffic;
    c.demand = demand;
    c
}

/// Below the limit nobody is denied: 3 to 64 nodes, 0.5x and 0.8x, with and without loss.
#[test]
fn under_the_limit_nothing_is_denied() {
    for nodes in [3, 10, 32, 64] {
        for (demand, traffic, loss) in [(0.5, Traffic::Uniform, 0.0), (0.8, Traffic::Poisson, 0.01)]
        {
            let mut c = config(window(100, 1000), nodes, traffic, demand);
            c.loss = loss;
            let r = sim::run(&c);
            assert!(
                r.false_denial_rate <= 0.001,
                "{nodes} nodes, {demand}x {}: {} false denials",
                traffic.name(),
                r.false_denial_rate
            );
        }
    }
}

/// Long windows: a minute and an hour, below the limit.
#[test]
fn long_windows_deny_nothing_below_the_limit() {
    for (window_ms, duration_s, nodes) in [(60_000u64, 180u64, 10usize), (3_600_000, 5400, 3)] {
        let mut c = config(window(100, window_ms), nodes, Traffic::Poisson, 0.8);
        c.duration_ns = duration_s * 1_000_000_000;
        let r = sim::run(&c);
        assert_eq!(r.false_denial_rate, 0.0, "{window_ms} ms window");
        assert!(r.requests > 100, "{}", r.requests);
    }
}

/// Large limits (above 2^32 per window) and long windows share like small ones.
#[test]
fn large_limits_and_month_long_windows_work() {
    let limit = (1u64 << 32) + 7;
    let month = 31 * 24 * 3600 * 1000;
    // A month-long window: thousands of requests in 5 s, far below the month's limit.
    let mut c = config(
        Policy::global_fixed_window(limit, Duration::from_millis(month)).unwrap(),
        3,
        Traffic::Poisson,
        100_000.0,
    );
    c.max_cost = 1000;
    c.duration_ns = 5_000_000_000;
    let r = sim::run(&c);
    assert!(r.requests > 100, "{}", r.requests);
    assert_eq!(r.false_denial_rate, 0.0);
    assert_eq!(r.policy_overshoot, 0.0);
    // A second-long window of more than 2^32 tokens, overloaded with costs of up to half of
    // it: the cluster admits its limit.
    let mut c = config(
        Policy::global_sliding_window(limit, Duration::from_millis(1000)).unwrap(),
        3,
        Traffic::Poisson,
        2.0,
    );
    c.max_cost = limit / 2;
    c.duration_ns = 60_000_000_000;
    let r = sim::run(&c);
    assert!(r.requests > 100, "{}", r.requests);
    assert_eq!(r.policy_overshoot, 0.0);
    assert!(r.utilization >= 0.9, "{}", r.utilization);
}

/// Above the limit the cluster admits about the limit, never more: every traffic model, 3 to
/// 64 nodes, 2x and 5x, with loss.
#[test]
fn over_the_limit_the_cluster_gets_its_limit() {
    let hotspot = Traffic::MovingHotspot {
        every_ns: 2_000_000_000,
        permille: 800,
    };
    for (nodes, demand, loss) in [(3, 2.0, 0.0), (16, 5.0, 0.02), (64, 2.0, 0.01)] {
        for traffic in [
            Traffic::Uniform,
            Traffic::SynchronizedBurst,
            hotspot,
            Traffic::Poisson,
        ] {
            for policy in [
                window(1000, 1000),
                Policy::token_bucket(1000, Duration::from_secs(1), 1000).unwrap(),
            ] {
                let mut c = config(policy, nodes, traffic, demand);
                c.loss = loss;
                c.duration_ns = 10_000_000_000;
                let r = sim::run(&c);
                let name = policy.algorithm().name();
                // Only the first requests admitted on credit (docs/overshoot.md, `first`).
                assert!(
                    r.policy_overshoot <= r.declared_bound.first + 1e-9,
                    "{name} {nodes} {}: {} over {:?}",
                    traffic.name(),
                    r.policy_overshoot,
                    r.declared_bound
                );
                assert!(
                    r.utilization >= 0.97,
                    "{name} {nodes} nodes {demand}x {}: utilization {}",
                    traffic.name(),
                    r.utilization
                );
            }
        }
    }
}

/// Clocks off by up to a second: windows follow the key's owner, nothing overshoots and the
/// cluster still gets its limit.
#[test]
fn clocks_a_second_apart_change_nothing() {
    for algorithm in 0..4 {
        for traffic in [
            Traffic::Uniform,
            Traffic::SynchronizedBurst,
            Traffic::Poisson,
        ] {
            let mut c = config(policy(algorithm, 1000, 1000), 7, traffic, 2.0);
            c.gossip_interval_ns = 25_000_000;
            c.skew_ns = 1_000_000_000;
            c.duration_ns = 10_000_000_000;
            let r = sim::run(&c);
            let name = c.policy.algorithm().name();
            assert!(
                r.policy_overshoot <= r.declared_bound.first + 1e-9,
                "{name} {}: {} over {:?}",
                traffic.name(),
                r.policy_overshoot,
                r.declared_bound
            );
            // A bucket hit by every node's burst at once: what other nodes hold in their
            // leases comes back by recall, and requests that wait longer than `max_wait`
            // for it are denied. Measured 81% at 7 nodes with every node's burst at the same
            // instant; 103% with a 300 ms `max_wait`.
            let bucket_burst = algorithm >= 2 && traffic == Traffic::SynchronizedBurst;
            let floor = if bucket_burst { 0.80 } else { 0.95 };
            assert!(
                r.utilization >= floor,
                "{name} {}: {}",
                traffic.name(),
                r.utilization
            );
        }
    }
}

/// Costs up to half the limit: the budget moves to the node that needs it.
#[test]
fn large_costs_move_the_budget_to_the_node_that_needs_it() {
    // The median of three seeds: with two requests a second, one denial moves a run's rate.
    let median = |c: &SimConfig, f: fn(&SimReport) -> f64| {
        let mut v: Vec<f64> = (1..=3)
            .map(|seed| {
                let mut c = c.clone();
                c.seed = seed;
                f(&sim::run(&c))
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v[1]
    };
    for nodes in [3, 16] {
        let mut c = config(window(100, 1000), nodes, Traffic::Poisson, 0.5);
        c.max_cost = 50;
        c.duration_ns = 200_000_000_000;
        let denied = median(&c, |r| r.false_denial_rate);
        assert!(denied <= 0.01, "{nodes} nodes: {denied}");
        c.demand = 2.0;
        let utilization = median(&c, |r| r.utilization);
        assert!(utilization >= 0.90, "{nodes} nodes: {utilization}");
    }
}

/// A node crashes for good: the key's owner (which keeps its budget), or the node taking
/// 90% of the traffic. The survivors are back at 95% of what one central limiter admits
/// within a second of detecting the crash, for short and long windows alike.
#[test]
fn the_survivors_recover_within_a_second_of_detecting_a_crash() {
    // The owner of key 1 (the simulator's first key) in a 3-node cluster.
    let owner = (0..3u64)
        .max_by_key(|&id| ratemesh::mesh::rendezvous_weight(1, id))
        .unwrap() as usize;
    let hot = Traffic::MovingHotspot {
        every_ns: 1_000_000_000_000,
        permille: 900,
    };
    for (window_ms, demand) in [(1000u64, 2.0), (3_600_000, 1.0)] {
        for (crashed, traffic) in [(owner, Traffic::Uniform), (0, hot)] {
            let mut c = config(window(1000, window_ms), 3, traffic, demand);
            c.duration_ns = 8_000_000_000;
            c.crashes.push(Crash {
                node: crashed,
                at_ns: 3_000_000_000,
                restart_ns: None,
            });
            let r = sim::run(&c);
            let what = format!("{window_ms} ms window, node {crashed} ({})", traffic.name());
            let detection = r.detection_ms.expect("detected");
            let recovery = r.recovery_ms_after_detection.expect("measured");
            assert!(detection <= 400.0, "{what}: detected after {detection} ms");
            assert!(
                recovery <= 1000.0,
                "{what}: back at 95% {recovery} ms after detection"
            );
            assert!(
                r.policy_overshoot <= r.declared_bound.total() + 1e-9,
                "{what}"
            );
        }
    }
}

/// Ten thousand keys, a few over their limit: the keys under it are not denied.
#[test]
fn zipf_keys_under_their_limit_are_not_denied() {
    let mut c = config(
        window(100, 1000),
        10,
        Traffic::Zipf {
            exponent_milli: 1000,
        },
        0.02,
    );
    c.keys = 10_000;
    c.duration_ns = 5_000_000_000;
    let r = sim::run(&c);
    assert!(
        r.false_denial_rate_under_limit_keys <= 0.001,
        "{}",
        r.false_denial_rate_under_limit_keys
    );
    assert!(
        r.oracle_admitted < r.requests,
        "some keys are over their limit"
    );
}

/// The baselines show why: local-only overshoots up to (N-1)x when demand allows, a static
/// split denies skewed traffic, stale sums overshoot under synchronized bursts.
#[test]
fn baselines_fail_where_expected() {
    let mut c = config(window(1000, 1000), 5, Traffic::Uniform, 6.0);
    let local = &sim::run_baselines(&c)[0].1;
    assert!(local.overshoot > 3.5, "local_only {}", local.overshoot);
    c.traffic = Traffic::OneNode;
    c.demand = 2.0;
    let split = &sim::run_baselines(&c)[1].1;
    assert!(
        split.utilization < 0.3,
        "static_split {}",
        split.utilization
    );
    c.traffic = Traffic::SynchronizedBurst;
    c.demand = 5.0;
    let stale = &sim::run_baselines(&c)[2].1;
    assert!(stale.overshoot > 1.0, "stale_sum {}", stale.overshoot);
    let ours = sim::run(&c);
    assert_eq!(ours.policy_overshoot, 0.0);
    // With a first-request credit, the first requests of the run (every node's at once)
    // overshoot by the declared `first` term at most.
    c.first_credit = 1;
    let credited = sim::run(&c);
    assert!(credited.declared_bound.first > 0.0);
    assert!(credited.policy_overshoot <= credited.declared_bound.first + 1e-9);
}

/// The same seed gives the same run.
#[test]
fn runs_are_deterministic() {
    let mut c = config(
        Policy::token_bucket(1000, Duration::from_secs(1), 1000).unwrap(),
        5,
        Traffic::Poisson,
        2.0,
    );
    c.loss = 0.1;
    c.jitter_ns = 5_000_000;
    c.duration_ns = 3_000_000_000;
    assert_eq!(sim::run(&c), sim::run(&c));
}

/// Rounds split into slices of a few keys, with frames and requests taken in between (as
/// `ratemesh node` splits a round of many keys): under the limit next to nothing is denied
/// (at most 0.1% at 1% loss, as with whole rounds), over it the bound holds, and the keys are
/// admitted about as much as with whole rounds.
#[test]
fn rounds_split_into_slices_keep_the_bound_and_deny_nothing_under_the_limit() {
    for (policy, demand) in [
        (window(100, 1000), 0.8),
        (window(100, 1000), 2.0),
        (
            Policy::fixed_window(100, Duration::from_secs(1)).unwrap(),
            2.0,
        ),
        (
            Policy::token_bucket(100, Duration::from_secs(1), 50).unwrap(),
            0.8,
        ),
    ] {
        let mut c = config(policy, 6, Traffic::Poisson, demand);
        c.keys = 300;
        c.nodes_per_key = Some(3);
        c.loss = 0.01;
        c.jitter_ns = 2_000_000;
        c.duration_ns = 4_000_000_000;
        let whole = sim::run(&c);
        c.round_slice_keys = 7;
        let sliced = sim::run(&c);
        assert_ne!(
            whole, sliced,
            "the slices changed nothing: were rounds split?"
        );
        assert!(
            sliced.policy_overshoot <= sliced.declared_bound.total() + 1e-9,
            "{sliced:?}"
        );
        assert!(!sliced.double_authority);
        if demand < 1.0 {
            // As with whole rounds at 1% loss (`under_the_limit_nothing_is_denied`).
            assert!(sliced.false_denial_rate <= 0.001, "{sliced:?}");
        }
        let ratio = sliced.admitted as f64 / whole.admitted as f64;
        assert!(
            (0.98..=1.02).contains(&ratio),
            "{ratio}: {sliced:?} {whole:?}"
        );
    }
}

/// A node that crashes and restarts gets its keys back and the bound holds.
#[test]
fn a_restarted_node_takes_its_keys_back_and_the_bound_holds() {
    for policy in [
        window(1000, 1000),
        Policy::token_bucket(1000, Duration::from_secs(1), 1000).unwrap(),
    ] {
        for node in 0..3 {
            let mut c = config(policy, 3, Traffic::Uniform, 2.0);
            c.duration_ns = 6_000_000_000;
            c.crashes.push(Crash {
                node,
                at_ns: 2_500_000_000,
                restart_ns: Some(2_800_000_000),
            });
            let r = sim::run(&c);
            assert!(
                r.policy_overshoot <= r.declared_bound.total() + 1e-9,
                "{} over {:?}",
                r.policy_overshoot,
                r.declared_bound
            );
            assert!(r.utilization > 0.9, "node {node}: {}", r.utilization);
        }
    }
}

/// A node restarts while its owner holds one of its earlier run's requests for room: the
/// grant that serves it reaches the new run, which must not take it as its own (a schedule
/// the random search found: 2.2% over a declared 1.9%).
#[test]
fn a_grant_for_a_restarted_nodes_earlier_run_is_not_spent_by_the_new_one() {
    let mut c = SimConfig::new(Policy::sliding_window(308, Duration::from_millis(607)).unwrap());
    c.nodes = 2;
    c.gossip_interval_ns = 35_000_000;
    c.latency_ns = 7_000_000;
    c.jitter_ns = 7_000_000;
    c.duplication = 0.10756130034520835;
    c.skew_ns = 1_000_000_000;
    c.traffic = Traffic::Uniform;
    c.demand = 3.9218960208438083;
    c.max_cost = 6;
    c.keys = 3;
    c.duration_ns = 3_000_000_000;
    c.seed = 10429224766447523777;
    c.crashes = vec![Crash {
        node: 1,
        at_ns: 1_681_625_643,
        restart_ns: Some(1_772_727_778),
    }];
    let r = sim::run(&c);
    assert!(
        r.policy_overshoot <= r.declared_bound.total() + 1e-9,
        "{} over {:?}",
        r.policy_overshoot,
        r.declared_bound
    );
}

/// Node 0 crashes; after it restarts, a partition cuts it and node 1 off from node 2. At the
/// heal node 1, the successor of both node 0 (which counts node 2 dead) and node 2 (which
/// counts node 0 dead), hears node 2 again: node 0 still holds the authority lease node 1's
/// earlier view confirmed while node 2 gets one from its new view. A successor's view must
/// rank the owner first and the successor itself second, which node 1's new view does not
/// (node 0 ranks between).
#[test]
fn a_successor_that_changes_its_view_does_not_confirm_a_second_owner() {
    let mut c = SimConfig::new(Policy::sliding_window(36, Duration::from_millis(252)).unwrap());
    c.nodes = 3;
    c.gossip_interval_ns = 6_000_000;
    c.latency_ns = 3_000_000;
    c.jitter_ns = 5_000_000;
    c.duplication = 0.07341307956338568;
    c.traffic = Traffic::Zipf {
        exponent_milli: 1000,
    };
    c.demand = 1.4103790577165645;
    c.max_cost = 4;
    c.keys = 3;
    c.duration_ns = 3_000_000_000;
    c.seed = 5123380076633937834;
    c.partition = Some(Partition {
        at_ns: 1_463_157_846,
        heal_ns: 1_822_123_149,
        minority: 2,
    });
    c.crashes = vec![Crash {
        node: 0,
        at_ns: 709_296_638,
        restart_ns: Some(1_478_031_180),
    }];
    let r = sim::run(&c);
    assert!(!r.double_authority, "{r:?}");
    assert!(
        r.policy_overshoot <= r.declared_bound.total() + 1e-9,
        "{} over {:?}",
        r.policy_overshoot,
        r.declared_bound
    );
}

/// Node 2 crashes and restarts just after a partition cut {0, 1} off from {2, 3}; nodes 0
/// and 1, which had declared node 2 dead, hold a majority of their view and grant. Node 2 got
/// its key back from node 3 at once, and counted nodes 0 and 1 as heard at its start: a
/// majority on paper. Only members whose frames reached it since count.
#[test]
fn a_restarted_node_does_not_count_members_it_has_not_heard_as_a_majority() {
    let mut c = SimConfig::new(Policy::sliding_window(20, Duration::from_millis(252)).unwrap());
    c.nodes = 4;
    c.gossip_interval_ns = 5_000_000;
    c.latency_ns = 0;
    c.traffic = Traffic::Uniform;
    c.demand = 0.3;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 4_771_158_737_145_102_026;
    c.partition = Some(Partition {
        at_ns: 300_000_000,
        heal_ns: 1_748_260_970,
        minority: 2,
    });
    c.crashes = vec![Crash {
        node: 2,
        at_ns: 254_863_523,
        restart_ns: Some(304_863_523),
    }];
    let r = sim::run(&c);
    assert!(!r.double_authority, "{r:?}");
    assert!(
        r.policy_overshoot <= r.declared_bound.total() + 1e-9,
        "{} over {:?}",
        r.policy_overshoot,
        r.declared_bound
    );
}

/// Loss alone (28%) makes node 3 declare node 1, the owner of a key it backs up, dead. Node 1
/// hands the key's authority to node 3 to merge and hand back; meanwhile node 3 hears it again
/// and confirms its lease, and node 1 must not make a fresh authority for the key (its window
/// and the previous one counted from zero: 38% over).
#[test]
fn an_owner_declared_dead_by_mistake_waits_for_its_authority_to_come_back() {
    let mut c = SimConfig::new(Policy::sliding_window(40, Duration::from_millis(616)).unwrap());
    c.nodes = 5;
    c.gossip_interval_ns = 8_000_000;
    c.latency_ns = 14_000_000;
    c.jitter_ns = 3_000_000;
    c.loss = 0.28523274478530847;
    c.duplication = 0.01590273614652874;
    c.traffic = Traffic::OneNode;
    c.demand = 3.824125301523922;
    c.keys = 3;
    c.duration_ns = 3_000_000_000;
    c.seed = 10_966_403_928_559_038_949;
    let r = sim::run(&c);
    assert!(!r.double_authority, "{r:?}");
    assert!(
        r.policy_overshoot <= r.declared_bound.total() + 1e-9,
        "{} over {:?}",
        r.policy_overshoot,
        r.declared_bound
    );
}

/// The owner's own holder waits while the owner's window turns over: the new window dropped
/// the holder's record (nothing in it), the grant that served the wait went to a record made
/// afresh that named no holding, the holder ignored it, and the window kept those tokens
/// counted (a fixed window then denied requests with two thirds of its limit left).
#[test]
fn a_waiting_holder_keeps_its_record_when_the_owners_window_turns() {
    let mut c = SimConfig::new(Policy::fixed_window(180, Duration::from_millis(227)).unwrap());
    c.nodes = 5;
    c.gossip_interval_ns = 21_000_000;
    c.latency_ns = 0;
    c.skew_ns = 1_000_000_000;
    c.traffic = Traffic::Bursty;
    c.demand = 0.8281341706315885;
    c.max_cost = 15;
    c.keys = 3;
    c.duration_ns = 3_000_000_000;
    c.seed = 199_804_567_457_859_981;
    let r = sim::run(&c);
    assert_eq!(r.false_denials_with_room, 0, "{r:?}");
}

/// An owner answers a holder's want twice, the second time a trip later with a shorter retry
/// time; the holder cannot tell when the repeated answer was decided, counted its retry from
/// its arrival, and denied requests into the owner's next window. A denial about a window
/// holds at most until the holder's lease of that window ends.
#[test]
fn a_denial_does_not_hold_past_its_window_however_late_it_came() {
    let mut c = SimConfig::new(Policy::fixed_window(108, Duration::from_millis(267)).unwrap());
    c.nodes = 5;
    c.gossip_interval_ns = 18_000_000;
    c.latency_ns = 12_000_000;
    c.jitter_ns = 10_000_000;
    c.traffic = Traffic::Bursty;
    c.demand = 0.8539770554733639;
    c.max_cost = 1;
    c.keys = 2;
    c.duration_ns = 3_000_000_000;
    c.seed = 904_921_711_814_975_485;
    let r = sim::run(&c);
    assert_eq!(r.false_denials_with_room, 0, "{r:?}");
}

/// Zero-latency links, a window's end between a holder's lease and its owner's: the holder
/// asks again a little later, not at once (which never let simulated time move on).
#[test]
fn a_holder_whose_lease_ended_before_its_owners_window_does_not_livelock() {
    let mut c = SimConfig::new(Policy::sliding_window(45, Duration::from_millis(822)).unwrap());
    c.nodes = 4;
    c.gossip_interval_ns = 27_000_000;
    c.latency_ns = 0;
    c.jitter_ns = 0;
    c.loss = 0.0;
    c.duplication = 0.03801923220774981;
    c.traffic = Traffic::Bursty;
    c.demand = 3.4831346026208565;
    c.max_cost = 18;
    c.keys = 2;
    c.duration_ns = 3_000_000_000;
    c.seed = 16864938848605992778;
    let report = sim::run(&c);
    assert!(report.policy_overshoot <= report.declared_bound.total() + 1e-9);
    assert!(report.utilization > 0.9, "{report:?}");
}

/// A bucket's owner crashes between backups: the successor's copy learns from the holders'
/// reports of the grants made after the backup, and takes those tokens out of its bucket.
#[test]
fn a_bucket_taken_over_after_a_crash_counts_grants_made_after_the_backup() {
    let rate = (110 * 1000u64).div_ceil(424);
    let mut c = SimConfig::new(Policy::token_bucket(rate, Duration::from_secs(1), 110).unwrap());
    c.nodes = 4;
    c.gossip_interval_ns = 20_000_000;
    c.latency_ns = 2_000_000;
    c.jitter_ns = 6_000_000;
    c.traffic = Traffic::SynchronizedBurst;
    c.demand = 2.143;
    c.keys = 3;
    c.duration_ns = 3_000_000_000;
    c.seed = 444_328_595_010_521_289;
    c.crashes.push(Crash {
        node: 1,
        at_ns: 952_659_709,
        restart_ns: None,
    });
    let report = sim::run(&c);
    assert!(
        report.policy_overshoot <= report.declared_bound.total() + 1e-9,
        "{report:?}"
    );
    assert!(report.utilization > 0.9, "{report:?}");
}

/// A node crashes and restarts during a partition; after the heal, two nodes that each still
/// count the other dead share one successor. The successor's view decides: only the node it
/// ranks first for the key may grant.
#[test]
fn two_nodes_that_count_each_other_dead_never_both_grant() {
    let mut c = SimConfig::new(Policy::sliding_window(20, Duration::from_millis(200)).unwrap());
    c.nodes = 3;
    c.gossip_interval_ns = 6_000_000;
    c.latency_ns = 0;
    c.traffic = Traffic::Uniform;
    c.demand = 0.3;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 2_043_646_434_102_449_112;
    c.partition = Some(Partition {
        at_ns: 925_704_671,
        heal_ns: 2_020_630_713,
        minority: 2,
    });
    c.crashes.push(Crash {
        node: (c.seed % 3) as usize,
        at_ns: 503_678_994,
        restart_ns: Some(1_073_181_678),
    });
    let report = sim::run(&c);
    assert!(!report.double_authority, "{report:?}");
    assert!(report.policy_overshoot <= report.declared_bound.total() + 1e-9);
}

/// Six nodes, one crashed, cut 3 | 2: the three declare the two dead and count three members,
/// the two still count five. At the heal, the first of the three the two hear makes them three
/// of five, while the owner among the three still grants their keys until it hears them: the
/// owner among the two waits until every member it counts alive has heard it again.
#[test]
fn a_node_declared_dead_grants_only_once_every_member_heard_it_again() {
    let mut c = SimConfig::new(Policy::sliding_window(59, Duration::from_millis(223)).unwrap());
    c.nodes = 6;
    c.gossip_interval_ns = 5_000_000;
    c.latency_ns = 1_000_000;
    c.jitter_ns = 3_000_000;
    c.traffic = Traffic::Uniform;
    c.demand = 2.04;
    c.max_cost = 2;
    c.keys = 3;
    c.duration_ns = 3_000_000_000;
    c.seed = 3_614_572_446_166_861_377;
    c.partition = Some(Partition {
        at_ns: 1_450_839_427,
        heal_ns: 1_650_839_427,
        minority: 2,
    });
    c.crashes.push(Crash {
        node: 3,
        at_ns: 1_359_945_307,
        restart_ns: None,
    });
    let report = sim::run(&c);
    assert!(!report.double_authority, "{report:?}");
    assert!(report.policy_overshoot <= report.declared_bound.total() + 1e-9);
}

/// Clocks a second apart, and a cut that takes both a key's owner and its successor away from
/// the majority: the majority's new owner starts afresh and numbers its windows from its own
/// clock, behind the old owner's (its window 1335 begins after the old owner's 1336). The
/// windows are measured in the order they began: counting every admission up to the new
/// owner's 1336 into the old owner's 1336 read 1.8 limits over a declared 1.
#[test]
fn windows_numbered_from_a_clock_behind_are_measured_in_the_order_they_began() {
    let mut c = SimConfig::new(Policy::fixed_window(20, Duration::from_millis(749)).unwrap());
    c.nodes = 5;
    c.gossip_interval_ns = 5_000_000;
    c.skew_ns = 1_000_000_000;
    c.traffic = Traffic::SynchronizedBurst;
    c.demand = 2.09;
    c.max_cost = 1;
    c.keys = 3;
    c.duration_ns = 3_000_000_000;
    c.seed = 5_030_162_218_097_329_080;
    c.partition = Some(Partition {
        at_ns: 663_391_478,
        heal_ns: 1_563_637_111,
        minority: 2,
    });
    let report = sim::run(&c);
    assert!(report.policy_overshoot > 0.0, "{report:?}");
    assert!(
        report.policy_overshoot <= report.declared_bound.total() + 1e-9,
        "{report:?}"
    );
    assert!(!report.double_authority, "{report:?}");
}

/// Four nodes, one crashed for good, then a cut that leaves the key's owner alone: it makes a
/// fresh authority while its lease still holds and grants its window 1164's tail and 1165.
/// The majority's new owner has no backup and makes a fresh window 1165 on a clock 4.6 ms
/// ahead, which held the cut-off owner's 1164 tail of those 4.6 ms on top of both owners'
/// limits (1.124 over a declared 1). A fresh authority made after a dead owner follows that
/// owner's clock, so its window never begins before the dead owner's of the same number.
#[test]
fn a_fresh_authority_after_a_dead_owner_follows_its_windows() {
    let mut c = SimConfig::new(Policy::fixed_window(226, Duration::from_millis(859)).unwrap());
    c.nodes = 4;
    c.gossip_interval_ns = 22_000_000;
    c.latency_ns = 6_000_000;
    c.jitter_ns = 2_000_000;
    c.duplication = 0.051_526_760_348_296_25;
    c.skew_ns = 7_000_000;
    c.traffic = Traffic::SynchronizedBurst;
    c.demand = 2.233_397_757_694_711;
    c.max_cost = 1;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 16_800_191_905_276_064_798;
    c.partition = Some(Partition {
        at_ns: 569_907_739,
        heal_ns: 810_979_219,
        minority: 2,
    });
    c.crashes.push(Crash {
        node: 2,
        at_ns: 243_010_658,
        restart_ns: None,
    });
    let report = sim::run(&c);
    assert!(
        report.policy_overshoot <= report.declared_bound.total() + 1e-9,
        "{report:?}"
    );
    assert!(!report.double_authority, "{report:?}");
}

/// Two nodes, one crashed: the other cannot declare it dead alone, so no authority begins the
/// windows until the restart. A sliding window's previous window is the one numbered just
/// before it, not the last one an authority began (three windows earlier here, full: counted
/// as the previous one, it read 0.033 over a declared 0).
#[test]
fn a_sliding_windows_previous_window_is_the_one_just_before_it() {
    let mut c = SimConfig::new(Policy::sliding_window(20, Duration::from_millis(306)).unwrap());
    c.nodes = 2;
    c.gossip_interval_ns = 5_000_000;
    c.latency_ns = 0;
    c.traffic = Traffic::Poisson;
    c.demand = 1.03;
    c.max_cost = 1;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 13_605_428_621_823_490_507;
    c.crashes.push(Crash {
        node: 1,
        at_ns: 694_493_801,
        restart_ns: Some(1_642_519_656),
    });
    let report = sim::run(&c);
    assert!(
        report.policy_overshoot <= report.declared_bound.total() + 1e-9,
        "{report:?}"
    );
}

/// A token bucket's owner crashes having granted since its last backup reached its successor,
/// to a holding of a node whose earlier holding the backup recorded: the crash term counts the
/// grants the backup does not show for that holding (it read 0, under a measured 0.0096):
/// it must not read 0 again.
#[test]
fn a_crashed_buckets_grants_since_its_backup_are_in_the_crash_term() {
    let mut c = SimConfig::new(Policy::token_bucket(153, Duration::from_secs(1), 108).unwrap());
    c.nodes = 3;
    c.gossip_interval_ns = 11_000_000;
    c.latency_ns = 3_000_000;
    c.jitter_ns = 1_000_000;
    c.skew_ns = 300_000_000;
    c.traffic = Traffic::MovingHotspot {
        every_ns: 700_000_000,
        permille: 900,
    };
    c.demand = 3.7785239613170774;
    c.max_cost = 13;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 4_342_467_997_176_814_646;
    c.crashes.push(Crash {
        node: 2,
        at_ns: 1_333_114_160,
        restart_ns: None,
    });
    let report = sim::run(&c);
    assert!(report.declared_bound.crash > 0.0, "{report:?}");
    assert!(
        report.policy_overshoot <= report.declared_bound.total() + 1e-9,
        "{report:?}"
    );
}

/// Costs up to 14 of 30, duplicated frames, no faults, demand under the limit: a closed
/// window lease's final count once counted as new demand every round, refills were leased
/// that nobody needed, and a request the limit had room for was denied.
#[test]
fn a_closed_leases_count_asks_for_no_refill_that_denies_a_request() {
    let mut c = SimConfig::new(Policy::fixed_window(30, Duration::from_millis(314)).unwrap());
    c.nodes = 3;
    c.gossip_interval_ns = 26_000_000;
    c.latency_ns = 14_000_000;
    c.jitter_ns = 9_000_000;
    c.duplication = 0.1313987607326061;
    c.skew_ns = 300_000_000;
    c.traffic = Traffic::Uniform;
    c.demand = 0.46962157871634347;
    c.max_cost = 14;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 6_140_760_820_542_505_611;
    let report = sim::run(&c);
    assert_eq!(report.false_denials_with_room, 0, "{report:?}");
}

/// Gossip faster than the link, bursts at window starts: holders still on the old window ask
/// again and again before the new window's grants reach them; those grants count toward
/// their wants, so no node is leased more than it needs while another's burst times out.
#[test]
fn wants_about_the_old_window_count_the_new_windows_grants_on_their_way() {
    let mut c = SimConfig::new(Policy::fixed_window(133, Duration::from_millis(270)).unwrap());
    c.nodes = 4;
    c.gossip_interval_ns = 7_000_000;
    c.latency_ns = 6_000_000;
    c.jitter_ns = 1_000_000;
    c.traffic = Traffic::SynchronizedBurst;
    c.demand = 0.808;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 10_680_990_194_296_683_162;
    let report = sim::run(&c);
    assert_eq!(report.false_denials_with_room, 0, "{report:?}");
}

/// A sliding window near its limit: the owner denies what it cannot grant now, and the
/// retry time it gives counts the tokens its recall brings back, so a later request that
/// fits is asked for instead of being denied on the holder.
#[test]
fn a_denials_retry_time_counts_the_recalled_tokens() {
    let mut c = SimConfig::new(Policy::sliding_window(120, Duration::from_millis(493)).unwrap());
    c.nodes = 2;
    c.gossip_interval_ns = 5_000_000;
    c.latency_ns = 8_000_000;
    c.traffic = Traffic::Poisson;
    c.demand = 0.876;
    c.max_cost = 16;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 9_767_138_945_502_960_284;
    let report = sim::run(&c);
    assert_eq!(report.false_denials_with_room, 0, "{report:?}");
}

/// Clocks 1 s apart: a denial's retry time counts from when the owner decided, not from
/// when its answer arrived, so a holder does not deny into the next window.
#[test]
fn a_denial_ends_at_the_owners_window_not_a_trip_later() {
    let mut c = SimConfig::new(Policy::fixed_window(253, Duration::from_millis(714)).unwrap());
    c.nodes = 5;
    c.gossip_interval_ns = 5_000_000;
    c.latency_ns = 4_000_000;
    c.jitter_ns = 4_000_000;
    c.duplication = 0.0797;
    c.skew_ns = 1_000_000_000;
    c.traffic = Traffic::Poisson;
    c.demand = 0.7995;
    c.max_cost = 13;
    c.keys = 3;
    c.duration_ns = 3_000_000_000;
    c.seed = 4_337_349_146_273_216_226;
    let report = sim::run(&c);
    assert_eq!(report.false_denials_with_room, 0, "{report:?}");
}

/// A node restarts while the owner's bucket state is fresh: a holder's report of tokens it
/// gave back to an earlier state does not refill the new one, and what it still holds is
/// counted as out of it.
#[test]
fn a_fresh_bucket_state_does_not_refund_an_earlier_states_returns() {
    let mut c = SimConfig::new(policy(2, 171, 329));
    c.nodes = 2;
    c.gossip_interval_ns = 17_000_000;
    c.latency_ns = 6_000_000;
    c.jitter_ns = 6_000_000;
    c.duplication = 0.0694;
    c.skew_ns = 7_000_000;
    c.traffic = Traffic::Bursty;
    c.demand = 3.3525;
    c.max_cost = 5;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 12_018_525_537_161_786_679;
    c.crashes.push(Crash {
        node: (c.seed % 2) as usize,
        at_ns: 1_547_600_000,
        restart_ns: Some(1_547_600_000 + 823_000_000),
    });
    let report = sim::run(&c);
    assert!(
        report.policy_overshoot <= report.declared_bound.total() + 1e-9,
        "{report:?}"
    );
}

/// A key's successor crashes: until its death is declared, the owner may not grant, and the
/// requests waiting on it run out their time. The owner denied them with a retry until the
/// end of its window (its room by the policy alone), so their holders denied every request
/// at once for the rest of that window, with most of the limit free (8 refused with room).
/// An owner that may not grant answers nothing: each holder's requests wait their own time.
#[test]
fn an_owner_that_may_not_grant_does_not_deny_until_its_windows_end() {
    let mut c = SimConfig::new(Policy::fixed_window(99, Duration::from_millis(519)).unwrap());
    c.nodes = 4;
    c.gossip_interval_ns = 37_000_000;
    c.latency_ns = 6_000_000;
    c.jitter_ns = 3_000_000;
    c.traffic = Traffic::Poisson;
    c.demand = 0.959_062_6;
    c.max_cost = 7;
    c.keys = 1;
    c.duration_ns = 3_000_000_000;
    c.seed = 13_668_273_115_080_771_774;
    c.crashes.push(Crash {
        node: 3,
        at_ns: 259_000_000,
        restart_ns: None,
    });
    let report = sim::run(&c);
    assert_eq!(report.refused_with_room, 0, "{report:?}");
}

/// Two nodes, one crashed: the other may not grant alone. The first request's wait ran out
/// at the owner, and its denial also denied the requests that the holder's later wants had
/// counted (arrived up to 50 ms after it, with time left to wait and the limit free).
#[test]
fn a_want_overdue_at_an_owner_that_may_not_grant_denies_no_later_request() {
    let mut c = SimConfig::new(Policy::fixed_window(373, Duration::from_millis(507)).unwrap());
    c.nodes = 2;
    c.gossip_interval_ns = 18_000_000;
    c.latency_ns = 0;
    c.jitter_ns = 2_000_000;
    c.duplication = 0.176_477_8;
    c.traffic = Traffic::Poisson;
    c.demand = 0.924_059_8;
    c.max_cost = 17;
    c.keys = 3;
    c.duration_ns = 3_000_000_000;
    c.gossip_budget_bytes_per_s = 127_794;
    c.first_credit = 1;
    c.seed = 17_880_635_581_676_272_927;
    c.crashes.push(Crash {
        node: 1,
        at_ns: 1_672_000_000,
        restart_ns: Some(2_657_000_000),
    });
    let report = sim::run(&c);
    assert_eq!(report.refused_with_room, 0, "{report:?}");
}
