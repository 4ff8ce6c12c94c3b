//! Lockouts (`block_for`) on the mesh: the key's first denial locks it out on every node
//! for the policy's time, each denial's retry time says when it ends, and the lockout
//! outlives its owner's crash and restart.

use super::*;
use crate::Decision;

const S: u64 = 1_000_000_000;

/// Ten requests a second per key.
pub(super) fn second_policy() -> Policy {
    Policy::global_fixed_window(10, Duration::from_secs(1)).unwrap()
}

/// A cluster whose policy locks a key out for `block` ns once denied.
pub(super) fn with_lockout(n: usize, policy: Policy, block: u64) -> Cluster {
    let mut c = Cluster::with(n, policy);
    c.lockout = block;
    for i in 0..n {
        let mut config = config(i, n, c.now, policy);
        config.lockouts = vec![block];
        c.nodes[i] = Some(Node::new(config, c.now).unwrap());
    }
    c.run_ms(100);
    c
}

/// Decide one request for `key` on node `i`, waiting for the owner if it must.
pub(super) fn decision(c: &mut Cluster, i: usize, key: u64) -> Decision {
    let id = match c.decide(i, key) {
        Admit::Now(d, _) => return d,
        Admit::Wait(id) => id,
    };
    for _ in 0..1_000 {
        c.run_ms(1);
        let found = c.events.iter().find_map(|(n, e)| match e {
            Event::Decided {
                id: got, decision, ..
            } if *n == i && *got == id => Some(*decision),
            _ => None,
        });
        if let Some(d) = found {
            return d;
        }
    }
    panic!("request {id} on node {i} never decided");
}

/// Lock `key` out: its limit on node 1, then one more, denied; return when it was denied
/// and its retry time.
pub(super) fn lock(c: &mut Cluster, key: u64) -> (u64, u64) {
    for n in 0..10 {
        assert!(
            decision(c, 1, key).is_allowed(),
            "request {n} under the limit"
        );
        c.run_ms(1);
    }
    let denied = decision(c, 1, key);
    assert!(!denied.is_allowed());
    (c.now, denied.retry_after_ns)
}

/// Send a request for `key` on each of `nodes` every 50 ms until `until`: each must be
/// denied with a retry time that ends within a few ms of `end`.
fn denied_until(c: &mut Cluster, key: u64, nodes: &[usize], until: u64, end: u64) {
    while c.now < until {
        for &i in nodes {
            let d = decision(c, i, key);
            assert!(
                !d.is_allowed(),
                "node {i} admitted at {} ms into the lockout",
                (c.now + 5 * S - end) / MS
            );
            let told = c.now + d.retry_after_ns;
            assert!(
                told.abs_diff(end) <= 50 * MS,
                "node {i}: retry at {} ms from the lockout's end",
                told as i64 / MS as i64 - end as i64 / MS as i64
            );
        }
        c.run_ms(50);
    }
}

#[test]
fn a_denial_locks_the_key_out_on_every_node_until_its_end() {
    let mut c = with_lockout(3, second_policy(), 5 * S);
    let key = c.key_owned_by(0);
    let (at, retry) = lock(&mut c, key);
    assert!(retry >= 5 * S - 10 * MS, "retry after {retry} ns");
    let end = at + 5 * S;
    // Every second has room by the policy; the lockout denies them all, on every node.
    denied_until(&mut c, key, &[0, 1, 2], end - 100 * MS, end);
    c.run_ms((end - c.now) / MS + 20);
    for i in 0..3 {
        assert!(
            decision(&mut c, i, key).is_allowed(),
            "node {i} still denied after the lockout"
        );
    }
    assert_eq!(c.node(0).stats().lockouts, 1);
}

#[test]
fn without_a_lockout_the_next_window_admits() {
    let mut c = Cluster::with(3, second_policy());
    let key = c.key_owned_by(0);
    lock(&mut c, key);
    c.run_ms(1_000);
    assert!(decision(&mut c, 2, key).is_allowed());
}

#[test]
fn a_lockout_outlives_its_owners_crash_and_restart() {
    let mut c = with_lockout(3, second_policy(), 5 * S);
    let key = c.key_owned_by(0);
    let (at, _) = lock(&mut c, key);
    let end = at + 5 * S;
    c.run_ms(20);
    // The owner crashes: its successor takes the key over, and the lockout with it.
    c.crash(0);
    c.run_ms(400);
    assert!(c.events.contains(&(1, Event::PeerDown(0))));
    let until = c.now + 1_500 * MS;
    denied_until(&mut c, key, &[1, 2], until, end);
    // It restarts and gets the key back: still locked out.
    c.restart(0);
    c.run_ms(300);
    assert!(c.node(0).is_running());
    assert!(c.node(0).authority_state(0, key).is_some(), "owner again");
    denied_until(&mut c, key, &[0, 1, 2], end - 100 * MS, end);
    c.run_ms((end - c.now) / MS + 20);
    assert!(decision(&mut c, 2, key).is_allowed());
}
