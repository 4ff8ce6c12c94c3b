//! Membership that follows the fleet, with mesh nodes stepped by hand: a node that knows no
//! member joins through one and learns the others from it; before it joined it decides by
//! `while_joining`; a node nobody answers starts a cluster of its own; a suspicion is
//! refuted through a member that still hears the suspect; deaths lower the majority, so a
//! cluster that loses members one at a time keeps granting down to two.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use ratemesh::Policy;
use ratemesh::mesh::{Admit, Event, Node, NodeConfig, WhileJoining};

const MS: u64 = 1_000_000;
const START: u64 = 1_000_000_000_000;
const LIMIT: u64 = 100;

fn policy() -> Policy {
    Policy::global_fixed_window(LIMIT, Duration::from_secs(3600)).unwrap()
}

/// Nodes by id on instant, lossless links. A node that gets a frame from one it does not
/// know adds it first, as the transport does for an authenticated connection, and a node
/// told of a member connects to it, as the transport dials it.
struct Cluster {
    nodes: BTreeMap<u64, Node>,
    now: u64,
    /// Frames from the first to the second node are dropped.
    cut: HashSet<(u64, u64)>,
    events: Vec<(u64, Event)>,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster {
            nodes: BTreeMap::new(),
            now: START,
            cut: HashSet::new(),
            events: Vec::new(),
        }
    }

    /// Nodes `1..=n`, each configured with all of them.
    fn of(n: u64) -> Cluster {
        let mut c = Cluster::new();
        let ids: Vec<u64> = (1..=n).collect();
        for &id in &ids {
            c.add(NodeConfig::new(id, ids.clone(), vec![policy()]));
        }
        c.run_ms(100);
        c
    }

    fn add(&mut self, mut config: NodeConfig) {
        config.incarnation = self.now / MS + config.id;
        let node = Node::new(config, self.now).unwrap();
        self.nodes.insert(node.id(), node);
    }

    /// `a` and `b` connect (each adds the other, as the transport does).
    fn connect(&mut self, a: u64, b: u64) {
        let now = self.now;
        self.node(a).add_member(now, b, None);
        self.node(b).add_member(now, a, None);
        self.deliver();
    }

    fn node(&mut self, id: u64) -> &mut Node {
        self.nodes.get_mut(&id).unwrap()
    }

    fn deliver(&mut self) {
        let mut learned = Vec::new();
        loop {
            let mut moved = false;
            let ids: Vec<u64> = self.nodes.keys().copied().collect();
            for &from in &ids {
                while let Some(t) = self.nodes.get_mut(&from).and_then(Node::poll_transmit) {
                    moved = true;
                    if self.cut.contains(&(from, t.to)) {
                        continue;
                    }
                    let now = self.now;
                    if let Some(node) = self.nodes.get_mut(&t.to) {
                        if !node.is_member(from) {
                            node.add_member(now, from, None);
                        }
                        node.handle_frame(now, from, &t.bytes).unwrap();
                    }
                }
                while let Some(e) = self.nodes.get_mut(&from).and_then(Node::poll_event) {
                    self.events.push((from, e));
                    // The transport dials a member it is told of.
                    if let Event::PeerLearned(peer) = e {
                        learned.push((from, peer));
                    }
                }
            }
            for (a, b) in learned.drain(..) {
                if self.nodes.contains_key(&b) {
                    let now = self.now;
                    self.node(a).add_member(now, b, None);
                    self.node(b).add_member(now, a, None);
                    moved = true;
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
            let now = self.now;
            for node in self.nodes.values_mut() {
                if node.poll_timeout() <= now {
                    node.handle_timeout(now);
                }
            }
            self.deliver();
        }
    }

    /// Send `count` requests for `key` to node `id`, one per millisecond; return how many
    /// were admitted (waiting ones included).
    fn send(&mut self, id: u64, key: u64, count: u64) -> u64 {
        let mut admitted = 0;
        for _ in 0..count {
            let now = self.now;
            match self.node(id).decide(0, key, 1, now) {
                Admit::Now(d, _) => admitted += u64::from(d.is_allowed()),
                Admit::Wait(wait) => {
                    self.deliver();
                    self.run_ms(1);
                    admitted += u64::from(self.events.iter().any(|(n, e)| {
                        *n == id
                            && matches!(e, Event::Decided { id, decision, .. } if *id == wait && decision.is_allowed())
                    }));
                    continue;
                }
            }
            self.run_ms(1);
        }
        admitted
    }

    fn alive_counts(&self) -> Vec<usize> {
        self.nodes.values().map(|n| n.alive_count()).collect()
    }
}

/// A node that knows only itself and joins.
fn joiner(id: u64) -> NodeConfig {
    let mut config = NodeConfig::new(id, vec![id], vec![policy()]);
    config.joins = true;
    config
}

#[test]
fn a_node_that_knows_no_member_joins_through_one_and_learns_the_others() {
    let mut c = Cluster::of(3);
    c.add(joiner(4));
    assert!(!c.node(4).is_joined());
    // It reaches node 1 only; node 1 answers with its members, who learn of node 4.
    c.connect(4, 1);
    c.run_ms(50);
    assert!(c.node(4).is_joined() && c.node(4).is_running());
    assert_eq!(c.alive_counts(), vec![4, 4, 4, 4]);
    assert!(
        c.events
            .iter()
            .any(|(n, e)| *n == 4 && matches!(e, Event::PeerLearned(2)))
    );
    // The joiner is a member like the others: a key is shared, its limit holds.
    let key = 77;
    let mut admitted = 0;
    for _ in 0..40 {
        for id in 1..=4 {
            admitted += c.send(id, key, 1);
        }
    }
    assert_eq!(admitted, LIMIT, "admitted {admitted} of {LIMIT}");
    assert_eq!(c.node(4).stats().joining_decisions, 0);
}

#[test]
fn before_it_joins_a_node_decides_by_while_joining() {
    for (mode, expected) in [
        (WhileJoining::LocalShare, LIMIT / 4),
        (WhileJoining::Deny, 0),
        (WhileJoining::Allow, 60),
    ] {
        let mut c = Cluster::new();
        let mut config = joiner(1);
        config.cluster_size = 4;
        config.while_joining = mode;
        config.join_timeout_ns = 3_600_000 * MS;
        c.add(config);
        let admitted = c.send(1, 5, 60);
        assert_eq!(admitted, expected, "{mode:?}");
        assert!(!c.node(1).is_joined());
        assert_eq!(c.node(1).stats().joining_decisions, 60);
    }
}

#[test]
fn a_node_nobody_answers_starts_a_cluster_after_the_join_timeout() {
    let mut c = Cluster::new();
    let mut config = joiner(1);
    config.join_timeout_ns = 500 * MS;
    c.add(config);
    c.run_ms(400);
    assert!(!c.node(1).is_joined());
    c.run_ms(200);
    assert!(c.node(1).is_joined() && c.node(1).is_running());
    assert_eq!(c.send(1, 5, LIMIT + 10), LIMIT);
    // A node that is told its seeds are itself alone starts at once.
    let mut c = Cluster::new();
    c.add(joiner(2));
    let now = c.now;
    c.node(2).start_alone(now);
    assert!(c.node(2).is_running());
}

#[test]
fn a_suspicion_is_refuted_through_a_member_that_still_hears_the_suspect() {
    let mut c = Cluster::of(3);
    // Node 1 stops hearing node 3 (one way); node 2 still does.
    c.cut.insert((3, 1));
    c.run_ms(1000);
    assert!(
        c.events
            .iter()
            .any(|(n, e)| *n == 1 && matches!(e, Event::PeerSuspected(3)))
    );
    assert!(
        !c.events
            .iter()
            .any(|(_, e)| matches!(e, Event::PeerDown(_))),
        "{:?}",
        c.events
    );
    assert!(c.node(3).refutations() > 0, "node 3 never refuted");
    assert!(c.node(1).is_alive(3));
    // Node 2 stops hearing it too: no one vouches for it any more.
    c.cut.insert((3, 2));
    c.run_ms(500);
    assert!(
        c.events
            .iter()
            .any(|(n, e)| *n == 1 && matches!(e, Event::PeerDown(3)))
    );
}

#[test]
fn deaths_lower_the_majority_so_a_cluster_shrinking_one_at_a_time_keeps_granting() {
    let mut c = Cluster::of(5);
    for dead in [5, 4, 3] {
        c.nodes.remove(&dead);
        c.run_ms(400);
        let left = c.nodes.len();
        assert!(
            c.alive_counts().iter().all(|&n| n == left),
            "{:?} after node {dead} died",
            c.alive_counts()
        );
    }
    // Two of five, each with a majority of the two alive.
    assert!(c.nodes.values().all(|n| n.has_majority()));
    assert_eq!(c.send(1, 9, 30) + c.send(2, 9, 30), 60);
    // Two at once of three would be no majority: one of three alive declares no one dead.
    let mut c = Cluster::of(3);
    c.nodes.remove(&3);
    c.nodes.remove(&2);
    c.run_ms(500);
    assert_eq!(c.alive_counts(), vec![3]);
    assert!(!c.node(1).has_majority());
}
