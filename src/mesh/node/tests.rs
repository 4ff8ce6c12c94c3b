//! Mesh nodes stepped by hand on instant, lossless links: a waiting request is granted by
//! the key's owner and later ones are admitted from the lease; bad frames change nothing;
//! membership detects failures and returns; the owner's crash, restart and drain hand the
//! key's budget on without admitting more than the limit; frames fit a datagram; a sparse
//! key's lone request costs the items the cost model counts.

mod admin;
mod calendar;
mod cluster;
mod credit;
mod frames;
mod limits;
mod lockouts;
mod refunds;
mod snapshots;
mod sparse_cost;

use std::time::Duration;

use crate::mesh::message::{Frame, Item};
use crate::mesh::{Admit, Event, Node, NodeConfig, wire};
use crate::{Policy, Verdict};

const MS: u64 = 1_000_000;
const START: u64 = 1_000_000_000_000;
const LIMIT: u64 = 1000;

/// A fixed window of an hour, so a test never crosses a window's end.
fn hour_policy() -> Policy {
    Policy::global_fixed_window(LIMIT, Duration::from_secs(3600)).unwrap()
}

/// A cluster of nodes with instant, lossless links, stepped one millisecond at a time.
pub(super) struct Cluster {
    nodes: Vec<Option<Node>>,
    policy: Policy,
    n: usize,
    now: u64,
    /// Links cut: frames between these node pairs are dropped.
    cut: Vec<(usize, usize)>,
    /// Links (from, to) whose frames lose their backups on the way (lost datagrams).
    strip: Vec<(usize, usize)>,
    /// Links (from, to) whose frames with a handoff are held back, to be delivered when
    /// the link is taken off this list (a stream's frame that datagrams overtake).
    slow: Vec<(usize, usize)>,
    held: Vec<(usize, usize, Vec<u8>)>,
    events: Vec<(usize, Event)>,
    /// Admissions per node (immediate and after waiting).
    admitted: Vec<u64>,
    denied: Vec<u64>,
    /// The policy's lockout in ns (0: none), for the nodes started again.
    lockout: u64,
    /// The policy's calendar period and time zone, for the nodes started again.
    calendar: Option<(&'static str, &'static str)>,
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
            strip: Vec::new(),
            slow: Vec::new(),
            held: Vec::new(),
            events: Vec::new(),
            admitted: vec![0; n],
            denied: vec![0; n],
            lockout: 0,
            calendar: None,
        };
        c.run_ms(100);
        c
    }

    fn deliver(&mut self) {
        for (from, to, bytes) in std::mem::take(&mut self.held) {
            if self.slow.contains(&(from, to)) {
                self.held.push((from, to, bytes));
            } else if let Some(node) = self.nodes[to].as_mut() {
                node.handle_frame(self.now, from as u64, &bytes).unwrap();
            }
        }
        loop {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                while let Some(t) = self.nodes[i].as_mut().and_then(Node::poll_transmit) {
                    moved = true;
                    let to = t.to as usize;
                    if self.cut.contains(&(i, to)) || self.cut.contains(&(to, i)) {
                        continue;
                    }
                    let mut frame: Frame = wire::decode(&t.bytes).unwrap();
                    if self.slow.contains(&(i, to))
                        && frame.items.iter().any(|i| matches!(i, Item::Handoff(_)))
                    {
                        self.held.push((i, to, t.bytes));
                        continue;
                    }
                    let bytes = if self.strip.contains(&(i, to)) {
                        frame.items.retain(|item| !matches!(item, Item::Backup(_)));
                        wire::encode(&frame).unwrap()
                    } else {
                        t.bytes
                    };
                    if let Some(node) = self.nodes[to].as_mut() {
                        node.handle_frame(self.now, i as u64, &bytes).unwrap();
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
        if let Admit::Now(d, _) = admit {
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
        let mut config = config(i, self.n, self.now, self.policy);
        config.lockouts = vec![self.lockout];
        if let Some((period, zone)) = self.calendar {
            config.set_calendar(0, period, zone).unwrap();
        }
        self.nodes[i] = Some(Node::new(config, self.now).unwrap());
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
