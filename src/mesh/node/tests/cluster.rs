//! Grants and leases, the limit across the cluster, the key cap, shrinking clusters, forgotten keys, failure detection, and the owner's crash, restart and drain.

use super::*;
use crate::mesh::message::{AuthorityState, KeyRef};

#[test]
fn a_waiting_request_is_granted_and_later_ones_use_the_lease() {
    let mut c = Cluster::new(3);
    let key = c.key_owned_by(0);
    // Node 1 holds nothing for the key: its first request waits for the owner.
    let now = c.now;
    let Admit::Wait(id) = c.node(1).decide(0, key, 1, now) else {
        panic!("a first request on a non-owner is decided at once");
    };
    c.deliver();
    assert!(
        c.events.iter().any(|(i, e)| *i == 1
            && matches!(e, Event::Decided { id: d, decision, .. } if *d == id && decision.is_allowed())),
        "{:?}",
        c.events
    );
    // With steady traffic the owner leases more than one request's worth: most requests
    // are decided on the spot, and the request path's read handle agrees.
    let mut at_once = 0;
    for _ in 0..200 {
        if matches!(c.decide(1, key), Admit::Now(d, _) if d.is_allowed()) {
            at_once += 1;
        }
        c.run_ms(1);
    }
    assert!(at_once >= 180, "{at_once} of 200 decided at once");
    assert_eq!(c.admitted[1], 201);
    let cells = c.node(1).cells();
    assert!(
        cells
            .decide(0, key, 1, c.now)
            .is_some_and(|d| d.is_allowed())
    );
    assert!(c.node(0).authority_state(0, key).is_some());
    assert!(c.node(1).authority_state(0, key).is_none());
}

/// A want answered at once leaves no timer behind (its resend instant is stale once the
/// grant came): every node sleeps until its next round.
#[test]
fn an_answered_want_leaves_the_nodes_asleep_until_their_next_round() {
    let mut c = Cluster::new(3);
    let key = c.key_owned_by(0);
    // Mid-round: the want's resend instant (2 ms on these links) comes before the round.
    c.run_ms(5);
    let now = c.now;
    assert!(matches!(c.node(1).decide(0, key, 1, now), Admit::Wait(_)));
    c.deliver();
    assert_eq!(c.admitted[1], 1);
    let round = 20 * MS;
    for i in 0..3 {
        assert_eq!(
            c.node(i).poll_timeout(),
            (now / round + 1) * round,
            "node {i}"
        );
    }
}

#[test]
fn the_cluster_admits_its_limit_and_no_more() {
    let mut c = Cluster::new(3);
    let key = c.key_owned_by(2);
    for _ in 0..(LIMIT * 3 / 2) / 3 {
        for i in 0..3 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.run_ms(300);
    let admitted = c.total_admitted();
    assert_eq!(admitted, LIMIT, "admitted {:?}", c.admitted);
    let denied: u64 = c.denied.iter().sum();
    assert_eq!(admitted + denied, LIMIT * 3 / 2);
    // A request that can never fit is CannotFit, not a retry.
    let now = c.now;
    match c.node(1).decide(0, key, LIMIT + 1, now) {
        Admit::Now(d, _) => assert_eq!(d.verdict, Verdict::CannotFit),
        other => panic!("{other:?}"),
    }
}

#[test]
fn keys_beyond_the_cap_are_held_to_the_nodes_share_without_gossip() {
    let mut c = Cluster::with_max_keys(2, hour_policy(), 100);
    // 200 distinct keys on node 1: 100 are held (and gossiped about); the others are
    // decided by node 1 alone, each within its share of the limit.
    for key in 1..=200 {
        c.decide(1, key);
        c.run_ms(1);
    }
    c.run_ms(100);
    assert_eq!(
        c.node(1).key_count(),
        100,
        "{} authorities",
        c.node(1).authority_count()
    );
    assert_eq!(c.node(1).cells().overflowed(), 100);
    assert_eq!(c.admitted[1], 200, "denied {:?}", c.denied);
    // One overflowing key sent 1000 times: node 1's share (half of the limit) and no more.
    let before = c.admitted[1];
    c.send(1, 150, 1000);
    assert_eq!(c.admitted[1] - before, LIMIT / 2 - 1);
}

#[test]
fn a_cluster_that_shrinks_by_clean_leaves_keeps_admitting() {
    let mut c = Cluster::new(5);
    let key = c.key_owned_by(0);
    c.send(1, key, 10);
    // Three of five members drain and leave, one after the other.
    for leaving in [4, 3, 2] {
        let now = c.now;
        c.node(leaving).leave(now);
        c.deliver();
        c.run_ms(30);
        c.crash(leaving);
        c.run_ms(500);
    }
    // The two left are a majority of the members that did not leave: the owner keeps
    // granting and the other node keeps being served.
    for _ in 0..200 {
        for i in 0..2 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.run_ms(200);
    assert_eq!(c.total_admitted(), 410, "{:?} {:?}", c.admitted, c.denied);
}

#[test]
fn a_key_forgotten_while_idle_does_not_take_its_old_grants_again() {
    // 10 tokens a second, a burst of 100: the bucket refills slowly, so the owner keeps the
    // key's record while node 1 forgets its idle holding.
    let policy = Policy::token_bucket(10, Duration::from_secs(1), 100).unwrap();
    let mut c = Cluster::with(2, policy);
    let key = c.key_owned_by(0);
    let t0 = c.now;
    // A token comes back every 100 ms.
    let refilled = |c: &Cluster| (c.now - t0) / (100 * MS);
    c.send(1, key, 200);
    assert!((100..=100 + refilled(&c)).contains(&c.total_admitted()));
    c.run_ms(3000);
    assert!(
        c.node(1).lease_state(0, key).is_none(),
        "an idle holding is forgotten"
    );
    assert!(c.node(0).authority_state(0, key).is_some());
    // The new holding starts afresh: what the bucket refilled, not the old grants again.
    c.send(1, key, 100);
    assert!(
        c.total_admitted() <= 100 + refilled(&c),
        "admitted {} with {} refilled",
        c.total_admitted(),
        refilled(&c)
    );
    assert!(c.total_admitted() >= 100 + 25, "{:?}", c.admitted);
}

#[test]
fn membership_detects_a_failure_and_the_return() {
    let mut c = Cluster::new(3);
    c.run_ms(100);
    // Node 2 goes silent.
    c.cut = vec![(2, 0), (2, 1)];
    c.run_ms(400);
    assert!(
        c.events.contains(&(0, Event::PeerDown(2))),
        "{:?}",
        c.events
    );
    assert!(c.node(0).members().contains(&(2, false)));
    // Node 2 alone sees no majority: it never declares the others dead.
    assert!(
        !c.events
            .iter()
            .any(|(i, e)| *i == 2 && matches!(e, Event::PeerDown(_)))
    );
    c.cut.clear();
    c.run_ms(100);
    assert!(c.events.contains(&(0, Event::PeerUp(2))), "{:?}", c.events);
    assert!(c.node(0).members().contains(&(2, true)));
}

#[test]
fn the_owners_crash_costs_at_most_its_lease_and_the_survivors_carry_on() {
    let mut c = Cluster::new(3);
    let key = c.key_owned_by(0);
    for _ in 0..200 {
        for i in 0..3 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.run_ms(30);
    let unspent_on_the_dead = c.nodes[0]
        .as_ref()
        .unwrap()
        .lease_state(0, key)
        .map_or(0, |h| h.unspent);
    let before = c.total_admitted();
    assert_eq!(before, 600);
    c.crash(0);
    // Detection takes `dead_after_rounds` rounds; the survivors' requests wait or use what
    // they hold meanwhile, and then the successor's backup takes over.
    for _ in 0..1000 {
        for i in 1..3 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.run_ms(300);
    assert!(c.events.contains(&(1, Event::PeerDown(0))));
    let successor = (1..3).find(|&i| c.node(i).authority_state(0, key).is_some());
    assert!(successor.is_some(), "no survivor took the key over");
    let total = c.total_admitted();
    assert!(total <= LIMIT, "admitted {total} of {LIMIT}");
    assert!(
        total + unspent_on_the_dead >= LIMIT,
        "admitted {total}, the dead node held {unspent_on_the_dead} unspent"
    );
}

#[test]
fn a_restarted_owner_gets_its_authority_back_before_granting() {
    let mut c = Cluster::new(3);
    let key = c.key_owned_by(0);
    for _ in 0..200 {
        for i in 0..3 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.run_ms(30);
    assert_eq!(c.total_admitted(), 600);
    // Node 0 crashes and is back before anyone declared it dead.
    c.crash(0);
    c.run_ms(50);
    c.restart(0);
    c.run_ms(100);
    assert!(c.node(0).is_running());
    let authority = c.node(0).authority_state(0, key).expect("owner again");
    let granted: u64 = authority.holders.iter().map(|h| h.tally.granted).sum();
    assert!(granted >= 400, "restored with {granted} granted");
    for _ in 0..400 {
        for i in 0..3 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.run_ms(300);
    let total = c.total_admitted();
    assert!(total <= LIMIT, "admitted {total} of {LIMIT}");
    assert!(total >= LIMIT - 400, "admitted {total}");
    // A fresh key after the recovery is not charged as the restarted node's.
    let fresh = c.key_owned_by(0) + 1_000_000;
    let admitted = c.total_admitted();
    c.send(0, fresh, 5);
    c.send(1, fresh, 5);
    assert_eq!(c.total_admitted(), admitted + 10);
}

#[test]
fn a_draining_owner_hands_its_keys_over_before_it_leaves() {
    let mut c = Cluster::new(3);
    let key = c.key_owned_by(2);
    for _ in 0..100 {
        for i in 0..3 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.run_ms(30);
    let now = c.now;
    c.node(2).leave(now);
    c.deliver();
    c.run_ms(30);
    assert!(c.node(2).stats().handoffs_sent >= 1);
    assert!(
        c.events.contains(&(0, Event::PeerLeft(2))),
        "{:?}",
        c.events
    );
    c.crash(2);
    let holder = (0..2)
        .find(|&i| c.node(i).authority_state(0, key).is_some())
        .expect("a survivor holds the key");
    let granted: u64 = c
        .node(holder)
        .authority_state(0, key)
        .unwrap()
        .holders
        .iter()
        .map(|h| h.tally.granted - h.tally.returned)
        .sum();
    assert!(granted >= 300, "handed over with {granted} granted");
    // No detection delay: the survivors use the whole rest of the limit at once.
    for _ in 0..600 {
        for i in 0..2 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.run_ms(100);
    assert_eq!(c.total_admitted(), LIMIT, "{:?}", c.admitted);
}

/// A leaving owner's handoff reaches its successor after the news that it leaves (its
/// datagrams overtake the stream's frame), and the successor still keeps its backup of an
/// earlier run of the key, idle by now (the later run's backups lost, its next sweep not
/// run yet): its own lease of the key shows a live authority, so it waits for the handoff
/// rather than take over that backup or make an authority afresh, and the cluster grants
/// nothing twice.
#[test]
fn a_successor_with_a_live_lease_awaits_a_late_handoff_rather_than_take_an_idle_backup() {
    let (mut c, key, successor, earlier) = an_earlier_run_dropped();
    c.node(successor).backups.keep(2, earlier);
    // A second run whose backups the successor does not hear: the bucket spent at all three
    // nodes, and a request waiting at the successor when the owner leaves.
    c.strip = vec![(2, successor)];
    let t0 = c.now;
    for _ in 0..60 {
        for i in 0..3 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.decide(successor, key);
    c.slow = vec![(2, successor)];
    let now = c.now;
    c.node(2).leave(now);
    // Two rounds, within the time a leaving owner's handoffs are awaited.
    c.run_ms(40);
    assert!(c.events.contains(&(successor, Event::PeerLeft(2))));
    assert!(c.node(successor).authority_state(0, key).is_none());
    c.slow.clear();
    c.run_ms(100);
    c.crash(2);
    for _ in 0..100 {
        for i in 0..2 {
            c.decide(i, key);
        }
        c.run_ms(1);
    }
    c.run_ms(200);
    // The first run, what the bucket held and what it refilled since, and no more.
    let refilled = (c.now - t0) / (100 * MS) + 1;
    assert!(
        c.total_admitted() <= 20 + 100 + refilled,
        "admitted {:?} with {refilled} refilled",
        c.admitted
    );
    assert!(c.total_admitted() >= 20 + 100, "{:?}", c.admitted);
}

/// An owner that dropped a key's idle authority and begins another run of it: its first
/// backups replace the successor's backup of the earlier run, idle by now, although the
/// versions of the new run begin again below it.
#[test]
fn the_backup_of_an_idle_run_gives_way_to_the_next_runs() {
    let (mut c, key, successor, mut earlier) = an_earlier_run_dropped();
    let at = KeyRef { policy: 0, key };
    // The earlier run, as if it had changed many more times, still kept (not swept yet).
    earlier.version += 100_000;
    let stale = earlier.version;
    c.node(successor).backups.keep(2, earlier);
    c.send(2, key, 10);
    c.run_ms(60);
    let kept = c.node(successor).backups.get(&at).map(|b| b.state.version);
    let owners = c.node(2).authority_state(0, key).map(|s| s.version);
    assert!(
        kept.is_some_and(|v| v < stale),
        "kept {kept:?}, owner's {owners:?}"
    );
    assert_eq!(kept, owners);
}

/// Three nodes and a bucket of 100 refilled at 10 a second; a key node 2 owns, used 20 times
/// by its successor until the owner dropped the key's idle authority. Returns the cluster,
/// the key, the successor, and the successor's last backup of that run (its sweep may have
/// dropped it since).
fn an_earlier_run_dropped() -> (Cluster, u64, usize, AuthorityState) {
    let policy = Policy::token_bucket(10, Duration::from_secs(1), 100).unwrap();
    let mut c = Cluster::with(3, policy);
    let key = c.key_owned_by(2);
    let successor = c.node(2).membership().owner_and_successor(key).1.unwrap() as usize;
    let at = KeyRef { policy: 0, key };
    c.send(successor, key, 20);
    let mut earlier = None;
    while c.node(2).authority_state(0, key).is_some() {
        if let Some(b) = c.node(successor).backups.get(&at) {
            earlier = Some(b.state.clone());
        }
        c.run_ms(1);
        assert!(
            c.now < START + 30_000 * MS,
            "the owner keeps its idle authority"
        );
    }
    (
        c,
        key,
        successor,
        earlier.expect("a backup of the first run"),
    )
}
