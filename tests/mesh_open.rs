//! Schedules the random search found that still break an invariant (docs/overshoot.md lists
//! them). Run with `cargo test --release --test mesh_open -- --include-ignored`.

use std::time::Duration;

use ratemesh::Policy;
use ratemesh::sim::{self, Crash, SimConfig, Traffic};

fn base(
    policy: Policy,
    nodes: usize,
    gossip_ms: u64,
    latency_ms: u64,
    jitter_ms: u64,
) -> SimConfig {
    let mut c = SimConfig::new(policy);
    c.nodes = nodes;
    c.gossip_interval_ns = gossip_ms * 1_000_000;
    c.latency_ns = latency_ms * 1_000_000;
    c.jitter_ns = jitter_ms * 1_000_000;
    c.duration_ns = 3_000_000_000;
    c
}

#[test]
#[ignore = "open: overshoot after a crash and restart under loss"]
fn open_overshoot_after_a_crash_and_restart_under_loss() {
    let mut c = base(
        Policy::sliding_window(173, Duration::from_millis(710)).unwrap(),
        6,
        13,
        13,
        5,
    );
    c.loss = 0.14977313573584203;
    c.skew_ns = 7_000_000;
    c.traffic = Traffic::SynchronizedBurst;
    c.demand = 1.550022323520282;
    c.max_cost = 13;
    c.keys = 3;
    c.seed = 16133903249110644332;
    c.crashes = vec![Crash {
        node: 2,
        at_ns: 657_723_325,
        restart_ns: Some(953_394_410),
    }];
    let r = sim::run(&c);
    assert!(
        r.policy_overshoot <= r.declared_bound.total() + 1e-9,
        "{r:?}"
    );
}

fn no_room_denied(mut c: SimConfig) {
    c.duration_ns = 3_000_000_000;
    let r = sim::run(&c);
    assert_eq!(r.false_denials_with_room, 0, "{r:?}");
}

#[test]
#[ignore = "open: a denial with room, sliding window, bursty"]
fn open_denial_with_room_sliding_bursty() {
    let mut c = base(
        Policy::sliding_window(64, Duration::from_millis(387)).unwrap(),
        4,
        29,
        14,
        9,
    );
    c.traffic = Traffic::Bursty;
    c.demand = 0.4066573382188023;
    c.max_cost = 14;
    c.keys = 3;
    c.seed = 12455513159329825418;
    no_room_denied(c);
}

#[test]
#[ignore = "open: a denial with room, token bucket, Zipf"]
fn open_denial_with_room_bucket_zipf() {
    let mut c = base(
        Policy::token_bucket(30, Duration::from_secs(1), 21).unwrap(),
        3,
        23,
        2,
        5,
    );
    c.skew_ns = 7_000_000;
    c.traffic = Traffic::Zipf {
        exponent_milli: 1000,
    };
    c.demand = 0.5716131985255665;
    c.max_cost = 6;
    c.keys = 2;
    c.seed = 14720110246234000885;
    no_room_denied(c);
}

#[test]
#[ignore = "open: a denial with room, token bucket, Poisson"]
fn open_denial_with_room_bucket_poisson() {
    let mut c = base(
        Policy::token_bucket(201, Duration::from_secs(1), 74).unwrap(),
        6,
        9,
        13,
        8,
    );
    c.traffic = Traffic::Poisson;
    c.demand = 0.8959988235697632;
    c.max_cost = 19;
    c.keys = 3;
    c.seed = 5969170143527734277;
    no_room_denied(c);
}
