//! Mesh nodes stepped by hand on instant, lossless links: a waiting request is granted by
//! the key's owner and later ones are admitted from the lease; bad frames change nothing;
//! membership detects failures and returns; the owner's crash, restart and drain hand the
//! key's budget on without admitting more than the limit; frames fit a datagram.

#[path = "support/cases.rs"]
mod cases;

use std::time::Duration;

use proptest::prelude::*;
use ratemesh::mesh::FrameError;
use ratemesh::mesh::message::{Frame, Header, Item, KeyRef, PolicyLimits, Want};
use ratemesh::mesh::tally::Tally;
use ratemesh::mesh::wire::{self, MAX_FRAME_BYTES, WIRE_VERSION, WireError};
use ratemesh::mesh::{Admit, Event, Node, NodeConfig};
use ratemesh::{Policy, Verdict};

const MS: u64 = 1_000_000;
const START: u64 = 1_000_000_000_000;
const LIMIT: u64 = 1000;

/// A fixed window of an hour, so a test never crosses a window's end.
fn hour_policy() -> Policy {
    Policy::global_fixed_window(LIMIT, Duration::from_secs(3600)).unwrap()
}

/// A cluster of nodes with instant, lossless links, stepped one millisecond at a time.
struct Cluster {
    nodes: Vec<Option<Node>>,
    policy: Policy,
    n: usize,
    now: u64,
    /// Links cut: frames between these node pairs are dropped.
    cut: Vec<(usize, usize)>,
    events: Vec<(usize, Event)>,
    /// Admissions per node (immediate and after waiting).
    admitted: Vec<u64>,
    denied: Vec<u64>,
}

impl Cluster {
    fn new(n: usize) -> Self {
        Cluster::with(n, hour_policy())
    }

    fn with(n: usize, policy: Policy) -> Self {
        Cluster::with_max_keys(n, policy, 1_000_000)
    }

    fn with_max_keys(n: usize, policy: Policy, max_keys: usize) -> Self {
        let nodes = (0..n)
            .map(|i| {
                let mut config = config(i, n, START, policy);
                config.max_keys = max_keys;
                Some(Node::new(config, START).unwrap())
            })
            .collect();
        let mut c = Cluster {
            nodes,
            policy,
            n,
            now: START,
            cut: Vec::new(),
            events: Vec::new(),
            admitted: vec![0; n],
            denied: vec![0; n],
        };
        c.run_ms(100);
        c
    }

    fn deliver(&mut self) {
        loop {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                while let Some(t) = self.nodes[i].as_mut().and_then(Node::poll_transmit) {
                    moved = true;
                    let to = t.to as usize;
                    if self.cut.contains(&(i, to)) || self.cut.contains(&(to, i)) {
                        continue;
                    }
                    if let Some(node) = self.nodes[to].as_mut() {
                        node.handle_frame(self.now, i as u64, &t.bytes).unwrap();
                    }
                }
                while let Some(e) = self.nodes[i].as_mut().and_then(Node::poll_event) {
                    if let Event::Decided { decision, .. } = e {
                        self.count(i, decision.verdict);
                    }
                    self.events.push((i, e));
                }
            }
            if !moved {
                break;
            }
        }
    }

    fn count(&mut self, node: usize, verdict: Verdict) {
        if verdict == Verdict::Allowed {
            self.admitted[node] += 1;
        } else {
            self.denied[node] += 1;
        }
    }

    fn run_ms(&mut self, ms: u64) {
        for _ in 0..ms {
            self.now += MS;
            for node in self.nodes.iter_mut().flatten() {
                if node.poll_timeout() <= self.now {
                    node.handle_timeout(self.now);
                }
            }
            self.deliver();
        }
    }

    /// Send `count` requests of cost 1 for `key` to node `i`, one per millisecond.
    fn send(&mut self, i: usize, key: u64, count: u64) {
        for _ in 0..count {
            self.decide(i, key);
            self.run_ms(1);
        }
    }

    fn decide(&mut self, i: usize, key: u64) -> Admit {
        let now = self.now;
        let admit = self.node(i).decide(0, key, 1, now);
        if let Admit::Now(d) = admit {
            self.count(i, d.verdict);
        }
        self.deliver();
        admit
    }

    fn node(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().unwrap()
    }

    fn total_admitted(&self) -> u64 {
        self.admitted.iter().sum()
    }

    /// A key whose owner is node `owner`.
    fn key_owned_by(&mut self, owner: usize) -> u64 {
        let first = self.nodes.iter().flatten().next().unwrap();
        (1..).find(|&k| first.owner_of(k) == owner as u64).unwrap()
    }

    /// Crash node `i` (its state is lost).
    fn crash(&mut self, i: usize) {
        self.nodes[i] = None;
    }

    fn restart(&mut self, i: usize) {
        self.nodes[i] = Some(start(i, self.n, self.now, self.policy));
        self.deliver();
    }
}

fn start(i: usize, n: usize, now: u64, policy: Policy) -> Node {
    Node::new(config(i, n, now, policy), now).unwrap()
}

fn config(i: usize, n: usize, now: u64, policy: Policy) -> NodeConfig {
    let mut config = NodeConfig::new(i as u64, (0..n as u64).collect(), vec![policy]);
    config.incarnation = now / MS + i as u64;
    // These tests follow the wait for the owner; the credit's own tests turn it on.
    config.first_credit = 0;
    config
}

/// A cluster whose nodes admit a key's first request on credit (`mesh_first_credit = 1`).
fn with_credit(n: usize, policy: Policy) -> Cluster {
    let mut c = Cluster::with(n, policy);
    for i in 0..n {
        let mut config = config(i, n, c.now, policy);
        config.first_credit = 1;
        c.nodes[i] = Some(Node::new(config, c.now).unwrap());
    }
    c.run_ms(100);
    c
}

#[test]
fn a_first_request_goes_on_credit_and_the_owner_is_asked_for_its_tokens() {
    let mut c = with_credit(3, hour_policy());
    let key = c.key_owned_by(0);
    let now = c.now;
    let Admit::Now(d) = c.node(1).decide(0, key, 1, now) else {
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
        Admit::Now(_) | Admit::Wait(_)
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
    assert!(matches!(c.node(1).decide(0, key, 1, now), Admit::Now(d) if d.is_allowed()));
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

/// Everything observable about a node's state for one key.
fn snapshot(node: &Node, key: u64) -> String {
    format!(
        "{:?} {:?} {:?} {} {:?}",
        node.authority_state(0, key),
        node.lease_state(0, key),
        node.backup(0, key),
        node.key_count(),
        node.members(),
    )
}

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
            && matches!(e, Event::Decided { id: d, decision } if *d == id && decision.is_allowed())),
        "{:?}",
        c.events
    );
    // With steady traffic the owner leases more than one request's worth: most requests
    // are decided on the spot, and the request path's read handle agrees.
    let mut at_once = 0;
    for _ in 0..200 {
        if matches!(c.decide(1, key), Admit::Now(d) if d.is_allowed()) {
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
        Admit::Now(d) => assert_eq!(d.verdict, Verdict::CannotFit),
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

fn want(policy: u32, granted: u64, used: u64) -> Want {
    Want {
        key: KeyRef { policy, key: 7 },
        window: 0,
        tally: Tally {
            granted,
            returned: 0,
            used,
        },
        closed: false,
        need: 1,
        smallest: 1,
        seq: 1,
        refill: false,
        demand: 16,
        spent_ago: 0,
        previous_used: None,
        holding: 1,
    }
}

fn frame(now: u64, items: Vec<Item>) -> Frame {
    Frame {
        header: Header {
            incarnation: 1,
            sent_at: now,
            ..Header::default()
        },
        items,
    }
}

#[test]
fn bad_frames_are_dropped_counted_and_change_nothing() {
    let mut c = Cluster::new(3);
    let key = 7;
    c.send(1, key, 50);
    c.send(0, key, 50);
    c.run_ms(60);
    let now = c.now;
    let before = snapshot(c.node(0), key);
    let dropped_before = c.node(0).stats().frames_dropped;
    let good = wire::encode(&frame(now, vec![Item::Want(want(0, 0, 0))])).unwrap();
    let mut wrong_version = good.clone();
    wrong_version[0] = WIRE_VERSION + 1;
    let truncated = good[..good.len() / 2].to_vec();
    let mut trailing = good.clone();
    trailing.push(0);
    let oversized = vec![WIRE_VERSION; MAX_FRAME_BYTES + 1];
    let mut claims_huge_vec = vec![WIRE_VERSION, 1, 0, 0, 0, 0, 0, 0, 0];
    claims_huge_vec.extend([253, 255, 255, 255, 255, 255, 255, 255, 255]);
    let encode = |f: Frame| wire::encode(&f).unwrap();
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("empty", vec![], 1),
        ("wrong version", wrong_version, 1),
        ("truncated", truncated, 1),
        ("trailing bytes", trailing, 1),
        ("oversized", oversized, 1),
        ("huge length claim", claims_huge_vec, 1),
        (
            "used above granted",
            encode(frame(now, vec![Item::Want(want(0, 5, 6))])),
            1,
        ),
        (
            "unknown policy",
            encode(frame(now, vec![Item::Want(want(9, 0, 0))])),
            1,
        ),
        (
            "incarnation 0",
            encode(Frame {
                header: Header::default(),
                items: vec![],
            }),
            1,
        ),
        ("from a stranger", good, 99),
    ];
    for (i, (name, bytes, from)) in cases.iter().enumerate() {
        let result = c.node(0).handle_frame(now, *from, bytes);
        assert!(result.is_err(), "{name} was accepted");
        assert_eq!(snapshot(c.node(0), key), before, "{name} changed the state");
        assert_eq!(
            c.node(0).stats().frames_dropped,
            dropped_before + i as u64 + 1,
            "{name} was not counted"
        );
    }
    assert!(matches!(
        c.node(0).handle_frame(now, 1, &[]),
        Err(FrameError::Wire(WireError::Empty))
    ));
    // The cluster carries on.
    let admitted = c.total_admitted();
    c.send(1, key, 10);
    assert_eq!(c.total_admitted(), admitted + 10);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases::cases(512)))]

    /// Arbitrary bytes (and bytes that start like a frame) never panic and change nothing
    /// unless they decode into a valid frame.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), versioned in any::<bool>()) {
        let mut node = start(0, 3, START, hour_policy());
        let mut bytes = bytes;
        if versioned && !bytes.is_empty() {
            bytes[0] = WIRE_VERSION;
        }
        let before = (snapshot(&node, 7), node.stats().frames_received);
        if node.handle_frame(START, 1, &bytes).is_err() {
            prop_assert_eq!((snapshot(&node, 7), node.stats().frames_received), before);
            prop_assert_eq!(node.stats().frames_dropped, 1);
        }
    }
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

#[test]
fn frames_fit_a_datagram() {
    let mut c = Cluster::new(2);
    let mut waiting = 0;
    for key in 0..2000 {
        let now = c.now;
        if let Admit::Wait(_) = c.node(1).decide(0, key, 1, now) {
            waiting += 1;
        }
    }
    assert!(waiting > 500, "{waiting} of 2000 keys are owned by node 0");
    let mut sizes = Vec::new();
    for _ in 0..3 {
        c.now += 20 * MS;
        let now = c.now;
        c.node(0).handle_timeout(now);
        c.node(1).handle_timeout(now);
        for from in [0, 1] {
            while let Some(t) = c.node(from).poll_transmit() {
                sizes.push(t.bytes.len());
                let to = t.to as usize;
                c.node(to).handle_frame(now, from as u64, &t.bytes).unwrap();
            }
        }
    }
    c.deliver();
    assert!(sizes.len() > 20, "2000 keys in {} frames", sizes.len());
    assert!(sizes.iter().all(|&s| s <= 1150), "{sizes:?}");
    let decided = c
        .events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Decided { decision, .. } if decision.is_allowed()))
        .count();
    assert_eq!(decided, waiting, "waiting requests admitted");
}

#[test]
fn grants_sent_to_a_nodes_earlier_run_are_dropped() {
    let mut c = Cluster::new(2);
    let key = c.key_owned_by(1);
    c.send(0, key, 3);
    c.run_ms(60);
    let now = c.now;
    let before = snapshot(c.node(0), key);
    let window = c.node(0).lease_state(0, key).unwrap().window;
    let me = c.node(0).incarnation();
    let sender = c.node(1).incarnation();
    // A grant the owner sent before it heard that node 0 restarted (addressed to node 0's
    // earlier run), for a holding number the new run uses too.
    let grant = |to_incarnation: u64| {
        let frame = Frame {
            header: Header {
                incarnation: sender,
                to_incarnation,
                sent_at: now,
                ..Header::default()
            },
            items: vec![Item::Grant(ratemesh::mesh::message::Grant {
                key: KeyRef { policy: 0, key },
                window,
                granted: 90,
                ends_at: now + 10_000_000_000,
                retry_after: 0,
                more_coming: 0,
                answers: 0,
                holding: 1,
            })],
        };
        wire::encode(&frame).unwrap()
    };
    c.node(0).handle_frame(now, 1, &grant(me + 1)).unwrap();
    assert_eq!(c.node(0).stats().to_earlier_run, 1);
    assert_eq!(snapshot(c.node(0), key), before);
    // Addressed to this run, the same grant counts.
    c.node(0).handle_frame(now, 1, &grant(me)).unwrap();
    assert_ne!(snapshot(c.node(0), key), before);
}

/// Reconfigure node `i` to a fixed window of `limit` per hour, announcing `digest`.
fn reconfigure(c: &mut Cluster, i: usize, limit: u64, digest: u64) {
    let policy = Policy::global_fixed_window(limit, Duration::from_secs(3600)).unwrap();
    c.node(i).reconfigure(vec![policy], digest).unwrap();
    c.deliver();
}

/// Send `count` requests for `key`, spread over the nodes in turn.
fn spread(c: &mut Cluster, key: u64, count: u64) {
    for r in 0..count {
        c.decide(r as usize % c.n, key);
        c.run_ms(1);
    }
    c.run_ms(200);
}

#[test]
fn a_raised_limit_applies_once_every_node_runs_it() {
    let mut c = Cluster::new(3);
    // One key owned by the node that changes first, one by a node that changes last.
    for owner in [0, 2] {
        let mut c2 = Cluster::new(3);
        let key = c2.key_owned_by(owner);
        spread(&mut c2, key, LIMIT + 200);
        assert_eq!(c2.total_admitted(), LIMIT);
        // Node 0 alone runs the new file: the old (lower) limit still holds everywhere.
        reconfigure(&mut c2, 0, 2 * LIMIT, 2);
        c2.run_ms(100);
        assert_eq!(c2.node(0).config_mismatch(), vec![1, 2]);
        assert_eq!(c2.node(1).config_mismatch(), vec![0]);
        assert_eq!(c2.node(0).config().policies[0].capacity(), LIMIT);
        spread(&mut c2, key, 300);
        assert_eq!(
            c2.total_admitted(),
            LIMIT,
            "owner {owner}: {:?}",
            c2.admitted
        );
        // Every node runs it: the new limit, counting what the window admitted already.
        reconfigure(&mut c2, 1, 2 * LIMIT, 2);
        reconfigure(&mut c2, 2, 2 * LIMIT, 2);
        c2.run_ms(100);
        for i in 0..3 {
            assert!(c2.node(i).config_mismatch().is_empty());
            assert_eq!(c2.node(i).config().policies[0].capacity(), 2 * LIMIT);
        }
        spread(&mut c2, key, LIMIT + 300);
        assert_eq!(
            c2.total_admitted(),
            2 * LIMIT,
            "owner {owner}: {:?}",
            c2.admitted
        );
    }
    // A lowered limit applies on every node as soon as they hear of it.
    let key = c.key_owned_by(0);
    spread(&mut c, key, 100);
    reconfigure(&mut c, 1, LIMIT / 2, 3);
    c.run_ms(100);
    for i in 0..3 {
        assert_eq!(
            c.node(i).config().policies[0].capacity(),
            LIMIT / 2,
            "node {i}"
        );
    }
    spread(&mut c, key, LIMIT);
    assert_eq!(c.total_admitted(), LIMIT / 2, "{:?}", c.admitted);
    // A node that runs the lower limit and dies stops counting: the others' apply again.
    c.crash(1);
    c.run_ms(1000);
    assert!(c.node(0).config_mismatch().is_empty());
    assert_eq!(c.node(0).config().policies[0].capacity(), LIMIT);
}

#[test]
fn a_live_change_keeps_the_algorithm_and_the_window() {
    let mut c = Cluster::new(2);
    let other_window = Policy::global_fixed_window(LIMIT, Duration::from_secs(60)).unwrap();
    let other_algorithm = Policy::global_sliding_window(LIMIT, Duration::from_secs(3600)).unwrap();
    for (policies, reason) in [
        (vec![other_window], "window"),
        (vec![other_algorithm], "algorithm"),
        (vec![hour_policy(), hour_policy()], "number"),
    ] {
        let error = c.node(0).reconfigure(policies, 9).unwrap_err();
        assert!(error.to_string().contains(reason), "{error}");
    }
    assert_eq!(c.node(0).config().policies, vec![hour_policy()]);
    c.run_ms(100);
    assert!(c.node(1).config_mismatch().is_empty());
}

#[test]
fn announced_limits_out_of_range_are_refused() {
    let mut c = Cluster::new(2);
    let now = c.now;
    let incarnation = c.node(1).incarnation();
    let frame = Frame {
        header: Header {
            incarnation,
            sent_at: now,
            digest: 5,
            ..Header::default()
        },
        items: vec![Item::Limits(vec![PolicyLimits {
            algorithm: 3,
            capacity: 0,
            interval_ns: 1,
            window_ns: 3_600_000_000_000,
        }])],
    };
    let bytes = wire::encode(&frame).unwrap();
    assert!(c.node(0).handle_frame(now, 1, &bytes).is_err());
    assert_eq!(c.node(0).config().policies[0].capacity(), LIMIT);
}
