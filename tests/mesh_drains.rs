//! Membership changes in the simulator keep every key's budget: a node drained for good, or
//! drained and started again, the key's owner or its successor, every node in turn (a
//! rolling restart), and a partition healed; a crash loses at most what the crashed node's
//! lease held. Each run lies inside one window of an hour and offers more than the limit,
//! so that what the cluster would not give any more shows (`SimReport::budget_lost`).

use std::time::Duration;

use ratemesh::Policy;
use ratemesh::sim::{self, Crash, Drain, Partition, SimConfig, SimReport, Traffic};

const S: u64 = 1_000_000_000;

/// The four algorithms the mesh shares, a limit of 200 an hour (a bucket: 200 refilled at 1
/// a second), and the demand that spends 60% of it in the first 8 s of a 20 s run (15
/// requests a second): 1% of the limit is 2 tokens.
fn policies() -> [(&'static str, Policy, f64); 4] {
    let hour = Duration::from_secs(3600);
    [
        (
            "fixed window",
            Policy::global_fixed_window(200, hour).unwrap(),
            270.0,
        ),
        (
            "sliding window",
            Policy::global_sliding_window(200, hour).unwrap(),
            270.0,
        ),
        (
            "token bucket",
            Policy::token_bucket(1, Duration::from_secs(1), 200).unwrap(),
            15.0,
        ),
        (
            "GCRA",
            Policy::gcra(1, Duration::from_secs(1), 200).unwrap(),
            15.0,
        ),
    ]
}

fn config(policy: Policy, demand: f64, keys: u64) -> SimConfig {
    let mut c = SimConfig::new(policy);
    c.nodes = 3;
    c.traffic = Traffic::Poisson;
    c.demand = demand;
    c.keys = keys;
    c.jitter_ns = 2_000_000;
    c.duration_ns = 20 * S;
    c
}

/// The budget is exact (to 1% of the limit), nothing went over, and nothing was denied
/// that one central limiter with the cluster's admissions would have admitted.
fn exact(what: &str, name: &str, r: &SimReport) {
    assert!(
        r.budget_lost <= 0.01,
        "{what}, {name}: lost {:.2}% of the limit: {r:?}",
        r.budget_lost * 100.0
    );
    assert!(
        r.policy_overshoot <= r.declared_bound.total() + 1e-9,
        "{what}, {name}: overshoot {} above {:?}",
        r.policy_overshoot,
        r.declared_bound
    );
    assert!(!r.double_authority, "{what}, {name}: two authorities");
    assert_eq!(r.frames_dropped, 0, "{what}, {name}");
}

#[test]
fn a_drained_owner_or_successor_takes_no_budget_with_it_whether_it_comes_back_or_not() {
    for (name, policy, demand) in policies() {
        for rank in 0..3 {
            for restart in [None, Some(9 * S)] {
                let mut c = config(policy, demand, 1);
                c.drains = vec![Drain {
                    node: sim::ranked(3, 0)[rank],
                    at_ns: 8 * S,
                    restart_ns: restart,
                }];
                let r = sim::run(&c);
                exact(&format!("rank {rank}, restart {restart:?}"), name, &r);
                assert_eq!(r.drains, 1);
            }
        }
    }
}

#[test]
fn a_rolling_restart_over_many_keys_takes_no_budget() {
    for (name, policy, demand) in policies() {
        // 20 keys, so that every node owns some; every node drains and starts again in turn.
        let mut c = config(policy, demand, 20);
        c.nodes = 4;
        c.drains = (0..4)
            .map(|node| Drain {
                node,
                at_ns: 6 * S + node as u64 * 2 * S,
                restart_ns: Some(7 * S + node as u64 * 2 * S),
            })
            .collect();
        let r = sim::run(&c);
        exact("rolling restart", name, &r);
        assert_eq!(r.false_denials_with_room, 0, "{name}: {r:?}");
    }
}

#[test]
fn a_healed_partition_gives_back_what_the_silent_side_did_not_use() {
    for (name, policy, demand) in policies() {
        for (at, heal) in [(8 * S, 8 * S + 600_000_000), (6 * S, 16 * S)] {
            let mut c = config(policy, demand, 3);
            c.partition = Some(Partition {
                at_ns: at,
                heal_ns: heal,
                minority: 1,
            });
            let r = sim::run(&c);
            exact(&format!("cut {at}..{heal}"), name, &r);
        }
    }
}

#[test]
fn a_crash_loses_at_most_what_the_crashed_nodes_lease_held() {
    for (name, policy, demand) in policies() {
        for node in 0..3 {
            let mut c = config(policy, demand, 3);
            c.crashes = vec![Crash {
                node,
                at_ns: 8 * S,
                restart_ns: Some(8 * S + 500_000_000),
            }];
            let r = sim::run(&c);
            assert!(
                r.budget_lost <= r.crash_loss + 0.01,
                "crash of {node}, {name}: lost {} where its lease held {}: {r:?}",
                r.budget_lost,
                r.crash_loss
            );
            assert!(!r.double_authority);
        }
    }
}

/// A key's owner that dropped the key's authority when it went idle and made a new one
/// since, then drains: its successor still keeps the backup of the earlier run (the new
/// run's backup lost on the way). The leaving node's frame carries the handoff with the news
/// that it leaves; the handed-over authority is installed before anything the news sets off,
/// and an idle backup is never taken over, so nothing the new run granted is granted again.
#[test]
fn a_drained_owner_whose_successor_kept_an_earlier_run_of_the_key_grants_nothing_twice() {
    let limit = 144;
    let rate = (limit * 1000u64).div_ceil(739);
    let mut c = SimConfig::new(Policy::token_bucket(rate, Duration::from_secs(1), limit).unwrap());
    c.nodes = 6;
    c.gossip_interval_ns = 7_000_000;
    c.latency_ns = 1_000_000;
    c.jitter_ns = 10_000_000;
    c.loss = 0.0819;
    c.duplication = 0.049;
    c.traffic = Traffic::SynchronizedBurst;
    c.demand = 0.94;
    c.max_cost = 18;
    c.keys = 1;
    c.duration_ns = 3 * S;
    c.seed = 1987989374866824518;
    c.drains.push(Drain {
        node: sim::ranked(6, 0)[0],
        at_ns: 1_368_000_000,
        restart_ns: None,
    });
    let r = sim::run(&c);
    assert!(r.drains > 0, "the drain ran: {r:?}");
    assert!(
        r.policy_overshoot <= r.declared_bound.total() + 1e-9,
        "overshoot {} above the declared {:?}: {r:?}",
        r.policy_overshoot,
        r.declared_bound
    );
}

/// A denial behind requests that still wait when the run ends is no lost budget: one
/// central limiter would serve those first. (Five nodes, a bucket of 80 per 770 ms, costs up
/// to 20: two requests wait for refill at the end while a third is denied.)
#[test]
fn a_denial_behind_requests_still_waiting_at_the_end_is_no_lost_budget() {
    let limit = 80;
    let rate = (limit * 1000u64).div_ceil(770);
    let mut c = SimConfig::new(Policy::token_bucket(rate, Duration::from_secs(1), limit).unwrap());
    c.nodes = 5;
    c.gossip_interval_ns = 8_000_000;
    c.latency_ns = 3_000_000;
    c.jitter_ns = 5_000_000;
    c.duplication = 0.107;
    c.traffic = Traffic::Poisson;
    c.demand = 1.90;
    c.max_cost = 20;
    c.keys = 3;
    c.duration_ns = 3 * S;
    c.seed = 4108869956718970338;
    c.drains.push(Drain {
        node: sim::ranked(5, 0)[0],
        at_ns: 948_000_000,
        restart_ns: None,
    });
    let r = sim::run(&c);
    assert_eq!(r.budget_lost, 0.0, "{r:?}");
}
