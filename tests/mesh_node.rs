//! One mesh node and small clusters of them, stepped by hand: bad frames change nothing,
//! membership detects failures and returns, a restarted node gets its counts back, deltas
//! stay within a datagram.

use std::time::Duration;

use proptest::prelude::*;
use ratemesh::Policy;
use ratemesh::mesh::message::{Announce, Delta, Frame, KeyUpdate, RoundHeader};
use ratemesh::mesh::node::{Event, FrameError, Node, NodeConfig};
use ratemesh::mesh::share::ONE;
use ratemesh::mesh::wire::{self, MAX_FRAME_BYTES, WIRE_VERSION, WireError};

const MS: u64 = 1_000_000;
const START: u64 = 1_000_000_000_000;

fn window_policy() -> Policy {
    Policy::fixed_window(1000, Duration::from_secs(1)).unwrap()
}

/// A cluster of `n` nodes with instant, lossless links, stepped one millisecond at a time.
struct Cluster {
    nodes: Vec<Option<Node>>,
    now: u64,
    /// Links cut: frames between these node pairs are dropped.
    cut: Vec<(usize, usize)>,
    events: Vec<(usize, Event)>,
}

impl Cluster {
    fn new(n: usize) -> Self {
        let nodes = (0..n).map(|i| Some(Self::start(i, n, START))).collect();
        let mut c = Cluster {
            nodes,
            now: START,
            cut: Vec::new(),
            events: Vec::new(),
        };
        c.deliver();
        c
    }

    fn start(i: usize, n: usize, now: u64) -> Node {
        let config = NodeConfig::new(i as u64, (0..n as u64).collect(), vec![window_policy()]);
        Node::new(config, now).unwrap()
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
                    self.events.push((i, e));
                }
            }
            if !moved {
                break;
            }
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

    fn node(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().unwrap()
    }
}

fn window_of(now: u64) -> u64 {
    window_policy().window_of(now)
}

/// Everything observable about a node's state for one key.
fn snapshot(node: &Node, key: u64, now: u64) -> (u32, Option<Vec<(u64, u64)>>, usize) {
    (
        node.share(0, key),
        node.counts(0, key, window_of(now))
            .map(|c| c.entries().to_vec()),
        node.key_count(),
    )
}

fn valid_delta(round: u64) -> Frame {
    Frame::Delta(Delta {
        header: RoundHeader {
            round,
            digest: 1,
            previous_digest: 1,
            members: vec![0, 1, 2],
            ack: 0,
        },
        since: 0,
        part: 0,
        parts: 1,
        keys: vec![KeyUpdate {
            policy: 0,
            key: 7,
            window: window_of(START),
            current: 5,
            previous: 0,
            changed: round,
            now: Announce {
                share: ONE / 3,
                demand: 16,
                released: 0,
            },
            before: Announce::default(),
        }],
    })
}

#[test]
fn bad_frames_are_dropped_counted_and_change_nothing() {
    let mut c = Cluster::new(3);
    c.run_ms(100);
    for _ in 0..50 {
        {
            let now = c.now;
            c.node(1).decide(0, 7, 1, now)
        };
    }
    c.run_ms(60);
    let now = c.now;
    let before = snapshot(c.node(0), 7, now);
    let dropped_before = c.node(0).stats().frames_dropped;
    let good = wire::encode(&valid_delta(now / (20 * MS))).unwrap();
    let mut wrong_version = good.clone();
    wrong_version[0] = WIRE_VERSION + 1;
    let truncated = good[..good.len() / 2].to_vec();
    let mut trailing = good.clone();
    trailing.push(0);
    let oversized = vec![WIRE_VERSION; MAX_FRAME_BYTES + 1];
    let claims_huge_vec = vec![
        WIRE_VERSION,
        0,
        0,
        0,
        0,
        0,
        0,
        253,
        255,
        255,
        255,
        255,
        255,
        255,
        255,
        255,
    ];
    let share_too_big = {
        let mut f = valid_delta(now / (20 * MS));
        if let Frame::Delta(d) = &mut f {
            d.keys[0].now.share = ONE + 1;
        }
        wire::encode(&f).unwrap()
    };
    let unknown_policy = {
        let mut f = valid_delta(now / (20 * MS));
        if let Frame::Delta(d) = &mut f {
            d.keys[0].policy = 9;
        }
        wire::encode(&f).unwrap()
    };
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("empty", vec![], 1),
        ("wrong version", wrong_version, 1),
        ("truncated", truncated, 1),
        ("trailing bytes", trailing, 1),
        ("oversized", oversized, 1),
        ("huge length claim", claims_huge_vec, 1),
        ("share above the budget", share_too_big, 1),
        ("unknown policy", unknown_policy, 1),
        ("from itself", good.clone(), 0),
        ("from a stranger when the cluster is full", good, 99),
    ];
    for (i, (name, bytes, from)) in cases.iter().enumerate() {
        let result = c.node(0).handle_frame(now, *from, bytes);
        assert!(result.is_err(), "{name} was accepted");
        assert_eq!(
            snapshot(c.node(0), 7, now),
            before,
            "{name} changed the state"
        );
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
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes (and bytes that start like a frame) never panic and change nothing
    /// unless they decode into a valid frame.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), versioned in any::<bool>()) {
        let mut node = Cluster::start(0, 3, START);
        let mut bytes = bytes;
        if versioned && !bytes.is_empty() {
            bytes[0] = WIRE_VERSION;
        }
        let before = (node.share(0, 7), node.key_count(), node.stats().frames_received);
        if node.handle_frame(START, 1, &bytes).is_err() {
            prop_assert_eq!((node.share(0, 7), node.key_count(), node.stats().frames_received), before);
            prop_assert_eq!(node.stats().frames_dropped, 1);
        }
    }
}

#[test]
fn a_peer_cannot_lower_a_count() {
    let mut c = Cluster::new(3);
    c.run_ms(100);
    for _ in 0..40 {
        {
            let now = c.now;
            c.node(1).decide(0, 7, 1, now)
        };
    }
    c.run_ms(60);
    let now = c.now;
    let window = window_of(now);
    assert_eq!(c.node(0).counts(0, 7, window).unwrap().get(1), 40);
    // A replayed (older, lower) update from node 1 is merged by maximum.
    let mut stale = valid_delta(now / (20 * MS));
    if let Frame::Delta(d) = &mut stale {
        d.keys[0].window = window;
        d.keys[0].current = 3;
    }
    c.node(0)
        .handle_frame(now, 1, &wire::encode(&stale).unwrap())
        .unwrap();
    assert_eq!(c.node(0).counts(0, 7, window).unwrap().get(1), 40);
}

#[test]
fn deltas_fit_a_datagram_and_carry_only_changes() {
    let mut c = Cluster::new(2);
    c.run_ms(100);
    for key in 0..2000 {
        {
            let now = c.now;
            c.node(0).decide(0, key, 1, now)
        };
    }
    c.now += 20 * MS;
    {
        let now = c.now;
        c.node(0).handle_timeout(now)
    };
    let mut sizes = Vec::new();
    while let Some(t) = c.node(0).poll_transmit() {
        assert!(!t.reliable);
        sizes.push(t.bytes.len());
        c.nodes[1]
            .as_mut()
            .unwrap()
            .handle_frame(c.now, 0, &t.bytes)
            .unwrap();
    }
    assert!(sizes.len() > 20, "2000 keys in {} datagrams", sizes.len());
    assert!(sizes.iter().all(|&s| s <= 1150), "{sizes:?}");
    // Node 1 has all of node 0's counts.
    let window = window_of(c.now);
    for key in [0, 999, 1999] {
        assert_eq!(c.node(1).counts(0, key, window).unwrap().get(0), 1);
    }
    // Once the demand has settled and node 1 acknowledged, a round without traffic carries
    // no keys (one small heartbeat).
    c.run_ms(400);
    c.now += 20 * MS;
    {
        let now = c.now;
        c.node(0).handle_timeout(now)
    };
    let mut quiet = Vec::new();
    while let Some(t) = c.node(0).poll_transmit() {
        quiet.push(t.bytes.len());
    }
    assert_eq!(quiet.len(), 1, "{quiet:?}");
    assert!(quiet[0] < 100, "{quiet:?}");
}

#[test]
fn membership_detects_a_failure_and_the_return() {
    let mut c = Cluster::new(3);
    c.run_ms(200);
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
fn a_restarted_node_gets_its_counts_back_before_admitting() {
    let mut c = Cluster::new(3);
    c.run_ms(100);
    let mut admitted = 0;
    for _ in 0..150 {
        if {
            let now = c.now;
            c.node(0).decide(0, 7, 1, now)
        }
        .is_allowed()
        {
            admitted += 1;
        }
    }
    assert!(admitted > 100);
    c.run_ms(60);
    // Crash node 0 and restart it a little later in the same window.
    c.nodes[0] = None;
    c.run_ms(50);
    let restarted = Cluster::start(0, 3, c.now);
    c.nodes[0] = Some(restarted);
    assert!(!c.node(0).is_running());
    let refused = {
        let now = c.now;
        c.node(0).decide(0, 7, 1, now)
    };
    assert!(!refused.is_allowed(), "admitted before recovering");
    c.deliver();
    assert!(c.node(0).is_running());
    let window = window_of(c.now);
    let own = c.node(0).counts(0, 7, window).map_or(0, |c| c.get(0));
    assert!(own >= admitted, "recovered {own} of {admitted}");
}
