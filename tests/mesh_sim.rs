//! The mesh under the deterministic simulator: random schedules never overshoot the declared
//! bound, counters never decrease and converge after a heal, and the README scenarios meet
//! their targets. All runs are simulated time (seeded), so nothing here depends on the
//! machine's speed.

use std::time::Duration;

use proptest::prelude::*;
use ratemesh::Policy;
use ratemesh::sim::{self, Crash, Partition, SimConfig, SimReport, Traffic};

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
    match index % 6 {
        0 => Traffic::Uniform,
        1 => Traffic::OneNode,
        2 => Traffic::MovingHotspot {
            every_ns: 700_000_000,
            permille: 900,
        },
        3 => Traffic::SynchronizedBurst,
        4 => Traffic::Poisson,
        _ => Traffic::Bursty,
    }
}

/// What every run must satisfy, whatever the schedule.
fn check_invariants(config: &SimConfig, report: &SimReport) -> Result<(), TestCaseError> {
    let bound = report.declared_bound;
    // With a partition, the tighter state-dependent bound (the cut-off side's share) holds.
    let partition = match report.partition_share_at_split {
        Some(share) => share.min(bound.partition),
        None => 0.0,
    };
    let allowed = bound.steady + bound.skew + partition + 1e-9;
    prop_assert!(
        report.policy_overshoot <= allowed,
        "policy overshoot {} above the declared {} (bound {:?}, split share {:?}) in {:?}",
        report.policy_overshoot,
        allowed,
        bound,
        report.partition_share_at_split,
        config
    );
    prop_assert!(
        !report.counter_decreased,
        "a gossiped count went down in {:?}",
        config
    );
    // Outside partitions, the allowances in effect never sum above the budget.
    if config.partition.is_none() {
        prop_assert!(
            report.max_share_sum <= 1.0 + 1e-9,
            "allowances summed to {} in {:?}",
            report.max_share_sum,
            config
        );
    }
    prop_assert_eq!(
        report.frames_dropped,
        0,
        "honest peers' frames were refused"
    );
    prop_assert!(report.admitted <= report.requests * config.max_cost);
    // After a heal with a second to spare, every node holds every other node's counts (a
    // node that crashes loses what it had not sent, so runs with a crash are left out).
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

proptest! {
    // 48 schedules in CI (about a second); `RATEMESH_SIM_CASES=5000` for a longer hunt.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("RATEMESH_SIM_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random clusters, links, faults and traffic: the measured overshoot (in the policy's own
    /// terms) never exceeds the declared bound.
    #[test]
    fn overshoot_never_exceeds_the_declared_bound(
        nodes in 2usize..=5,
        gossip_ms in 5u64..=40,
        latency_ms in 0u64..=15,
        jitter_ms in 0u64..=10,
        loss in 0.0f64..0.3,
        duplication in 0.0f64..0.2,
        skewed in prop::bool::weighted(0.15),
        algorithm in 0u8..4,
        traffic_index in 0u8..6,
        demand in 0.3f64..4.0,
        max_cost in 1u64..=4,
        keys in 1u64..=2,
        limit in 20u64..=400,
        window_ms in 200u64..=1000,
        partition in prop::option::of((0.3f64..1.5, 0.2f64..1.5, 1usize..=2)),
        crash in prop::option::of((0.2f64..2.0, 0.05f64..1.5)),
        seed in any::<u64>(),
    ) {
        let mut c = SimConfig::new(policy(algorithm, limit, window_ms));
        c.nodes = nodes;
        c.gossip_interval_ns = gossip_ms * 1_000_000;
        c.latency_ns = latency_ms * 1_000_000;
        c.jitter_ns = jitter_ms * 1_000_000;
        c.loss = loss;
        c.duplication = duplication;
        c.skew_ns = if skewed { 7_000_000 } else { 0 };
        c.traffic = traffic(traffic_index);
        c.demand = demand;
        c.max_cost = max_cost.min(limit);
        c.keys = keys;
        c.duration_ns = 3_000_000_000;
        c.seed = seed;
        if let Some((at, length, minority)) = partition {
            c.partition = Some(Partition {
                at_ns: (at * 1e9) as u64,
                heal_ns: ((at + length) * 1e9) as u64,
                minority: minority.min(nodes - 1),
            });
        }
        if let Some((at, down)) = crash {
            c.crashes.push(Crash {
                node: (seed % nodes as u64) as usize,
                at_ns: (at * 1e9) as u64,
                restart_ns: ((at + down) * 1e9) as u64,
            });
        }
        let report = sim::run(&c);
        check_invariants(&c, &report)?;
    }
}

fn scenario(policy: Policy, traffic: Traffic) -> SimConfig {
    let mut c = SimConfig::new(policy);
    c.traffic = traffic;
    c
}

fn sliding() -> Policy {
    Policy::sliding_window(1000, Duration::from_secs(1)).unwrap()
}

fn bucket() -> Policy {
    Policy::token_bucket(1000, Duration::from_secs(1), 1000).unwrap()
}

const HOTSPOT: Traffic = Traffic::MovingHotspot {
    every_ns: 2_000_000_000,
    permille: 800,
};

/// The README's targets: 5 nodes, 20 ms gossip, 1 ms latency, 2x demand, 20 s.
#[test]
fn readme_scenarios_meet_their_targets() {
    for policy in [sliding(), bucket()] {
        let name = policy.algorithm().name();
        for (traffic, max_overshoot, min_utilization) in [
            (Traffic::Uniform, 0.01, 0.97),
            (Traffic::OneNode, 0.01, 0.97),
            (Traffic::SynchronizedBurst, 0.02, 0.0),
            (HOTSPOT, 0.02, 0.90),
        ] {
            let r = sim::run(&scenario(policy, traffic));
            assert!(
                r.overshoot <= max_overshoot && r.utilization >= min_utilization,
                "{name} {}: overshoot {} utilization {}",
                traffic.name(),
                r.overshoot,
                r.utilization
            );
            assert_eq!(r.policy_overshoot, 0.0, "{name} {}", traffic.name());
        }
        let mut lossy = scenario(policy, Traffic::Uniform);
        lossy.loss = 0.05;
        lossy.latency_ns = 10_000_000;
        let r = sim::run(&lossy);
        assert!(r.overshoot <= 0.02, "{name} lossy: {}", r.overshoot);

        let mut split = scenario(policy, Traffic::Uniform);
        split.partition = Some(Partition {
            at_ns: 5_000_000_000,
            heal_ns: 10_000_000_000,
            minority: 2,
        });
        let r = sim::run(&split);
        let share = r
            .partition_share_at_split
            .expect("a partition was asked for");
        assert!(
            r.policy_overshoot <= share + 1e-9 && share <= r.declared_bound.partition,
            "{name} partition: {} over a bound of {share}",
            r.policy_overshoot
        );
        let converged = r
            .convergence_ms_after_heal
            .expect("converged after the heal");
        assert!(
            converged <= 3.0 * 20.0,
            "{name}: converged after {converged} ms"
        );
    }
}

/// The baselines show why: local-only overshoots up to (N-1)x when demand allows, a static
/// split wastes skewed traffic's budget.
#[test]
fn baselines_fail_where_expected() {
    let mut c = scenario(sliding(), Traffic::Uniform);
    c.demand = 6.0;
    let baselines = sim::run_baselines(&c);
    let local = &baselines[0].1;
    assert!(
        local.overshoot > 3.5,
        "local_only overshoot {}",
        local.overshoot
    );
    let skewed = sim::run_baselines(&scenario(sliding(), Traffic::OneNode));
    let split = &skewed[1].1;
    assert!(
        split.utilization < 0.3,
        "static_split utilization {}",
        split.utilization
    );
    let mut burst = scenario(sliding(), Traffic::SynchronizedBurst);
    burst.demand = 5.0;
    let stale = &sim::run_baselines(&burst)[2].1;
    assert!(
        stale.overshoot > 1.0,
        "stale_sum overshoot {}",
        stale.overshoot
    );
    let ours = sim::run(&burst);
    assert!(
        ours.overshoot <= 0.02,
        "ratemesh overshoot {}",
        ours.overshoot
    );
}

/// The same seed gives the same run.
#[test]
fn runs_are_deterministic() {
    let mut c = scenario(bucket(), Traffic::Poisson);
    c.loss = 0.1;
    c.jitter_ns = 5_000_000;
    c.duration_ns = 3_000_000_000;
    assert_eq!(sim::run(&c), sim::run(&c));
}

/// A node that crashes and restarts within a window gets its counts back and the cluster
/// stays within the bound.
#[test]
fn a_restarted_node_recovers_and_the_bound_holds() {
    for policy in [sliding(), bucket()] {
        let mut c = scenario(policy, Traffic::Uniform);
        c.duration_ns = 6_000_000_000;
        c.crashes.push(Crash {
            node: 2,
            at_ns: 2_500_000_000,
            restart_ns: 2_800_000_000,
        });
        let r = sim::run(&c);
        assert!(r.policy_overshoot <= 1e-9, "{}", r.policy_overshoot);
        assert!(r.utilization > 0.9, "{}", r.utilization);
    }
}
