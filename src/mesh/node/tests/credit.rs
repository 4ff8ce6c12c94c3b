//! A key's first request on credit: once per window and node, never where the fleet taking it at once would cost over a tenth of the limit.

use super::*;

#[test]
fn a_first_request_goes_on_credit_and_the_owner_is_asked_for_its_tokens() {
    let mut c = with_credit(3, hour_policy());
    let key = c.key_owned_by(0);
    let now = c.now;
    let Admit::Now(d, _) = c.node(1).decide(0, key, 1, now) else {
        panic!("a first request on credit is decided at once");
    };
    assert!(d.is_allowed());
    assert_eq!((d.limit, d.remaining), (LIMIT, LIMIT - 1));
    assert_eq!(c.node(1).stats().credited, 1);
    c.deliver();
    // The want went out with the request: the owner granted its token (and a lease), the
    // holding waits for nothing, and no decision comes out of it a second time.
    let owner = c
        .node(0)
        .authority_state(0, key)
        .expect("the owner knows the key");
    let record = owner
        .holders
        .iter()
        .find(|h| h.node == 1)
        .expect("node 1 holds");
    assert!(record.tally.granted >= 1, "{record:?}");
    assert_eq!(c.node(1).lease_state(0, key).unwrap().waiting, 0);
    assert!(
        !c.events
            .iter()
            .any(|(_, e)| matches!(e, Event::Decided { .. })),
        "{:?}",
        c.events
    );
    // A second first request of another cost waits as before, and the next ones of this
    // key go on the lease, not on credit.
    c.send(1, key, 20);
    assert_eq!(c.node(1).stats().credited, 1);
    assert_eq!(c.admitted[1], 20);
    // A request the credit cannot cover waits for the owner.
    let other = key + 1000;
    let now = c.now;
    assert!(matches!(
        c.node(2).decide(0, other, 2, now),
        Admit::Now(..) | Admit::Wait(_)
    ));
    assert_eq!(c.node(2).stats().credited, 0);
}

#[test]
fn a_node_takes_a_keys_credit_once_per_window_and_a_denial_stands() {
    // 40 a second over 3 nodes: each node's credit is 1, the fleet's at most 3 (7.5%).
    let policy = Policy::global_fixed_window(40, Duration::from_secs(1)).unwrap();
    let mut c = with_credit(3, policy);
    // Start just after a window begins, so the test stays inside one window.
    let w = 1_000 * MS;
    c.run_ms((w - c.now % w) / MS + 1);
    let key = c.key_owned_by(0);
    c.send(0, key, 60);
    assert_eq!(c.admitted[0], 40, "{:?}", c.denied);
    // Node 1's first request goes on credit: one over the limit, the declared cost.
    let now = c.now;
    assert!(matches!(c.node(1).decide(0, key, 1, now), Admit::Now(d, _) if d.is_allowed()));
    c.deliver();
    // The owner denied its tokens: node 1 now denies the key at once, keeps the holding
    // past its idle rounds, and takes no second credit in this window.
    c.run_ms(400);
    assert!(c.node(1).lease_state(0, key).is_some());
    c.send(1, key, 20);
    assert_eq!(c.admitted[1], 0, "{:?}", c.denied);
    assert_eq!(c.node(1).stats().credited, 1);
    assert_eq!(c.total_admitted() + c.node(1).stats().credited, 41);

    // A bucket (40 a second, a burst of 40) kept empty by node 0: node 1, asking every
    // 300 ms, forgets the key between requests, but takes its credit once per second (the
    // time to fill the burst) at most.
    let policy = Policy::token_bucket(40, Duration::from_secs(1), 40).unwrap();
    let mut c = with_credit(3, policy);
    let key = c.key_owned_by(0);
    for _ in 0..10 {
        for _ in 0..300 {
            if c.now.is_multiple_of(10 * MS) {
                c.decide(0, key);
            }
            c.run_ms(1);
        }
        c.decide(1, key);
    }
    let credited = c.node(1).stats().credited;
    assert!((1..=3).contains(&credited), "{credited} credits in 3 s");
}

#[test]
fn no_credit_where_the_fleet_taking_it_at_once_would_cost_over_a_tenth() {
    // 20 a second over 3 nodes: 3 credits would be 15% of the limit.
    let policy = Policy::global_fixed_window(20, Duration::from_secs(3600)).unwrap();
    let mut c = with_credit(3, policy);
    let key = c.key_owned_by(0);
    let now = c.now;
    assert!(matches!(c.node(1).decide(0, key, 1, now), Admit::Wait(_)));
    assert_eq!(c.node(1).stats().credited, 0);
}
