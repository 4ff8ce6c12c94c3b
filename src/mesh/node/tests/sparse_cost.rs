//! What a sparse key's lone request costs in gossip: the items its whole life sends, from
//! the want to the moment every node has forgotten it, for each kind of global policy.
//! These are the per-request terms of the cost model in `docs/benchmarks.md`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Policy;
use crate::mesh::message::Item;
use crate::mesh::wire::check::decode as decode_frame;
use crate::mesh::{Admit, Event, Node, NodeConfig};

const MS: u64 = 1_000_000;

/// Three nodes on lossless, instant links, stepped a millisecond at a time; the items sent
/// (but membership and heartbeats) are tallied by kind.
struct Three {
    nodes: Vec<Node>,
    policy: Policy,
    now: u64,
    items: BTreeMap<&'static str, u32>,
    decided: Vec<bool>,
}

impl Three {
    fn new(policy: Policy) -> Three {
        let now = 1_000_000_000;
        let nodes = (1..=3)
            .map(|id| {
                let mut config = NodeConfig::new(id, vec![1, 2, 3], vec![policy]);
                config.first_credit = 0;
                Node::new(config, now).unwrap()
            })
            .collect();
        let mut three = Three {
            nodes,
            policy,
            now,
            items: BTreeMap::new(),
            decided: Vec::new(),
        };
        while !three.nodes.iter().all(Node::is_running) {
            three.step();
        }
        three.run_ms(300);
        three.items.clear();
        three
    }

    fn step(&mut self) {
        self.now += MS;
        for i in 0..self.nodes.len() {
            if self.nodes[i].poll_timeout() <= self.now {
                self.nodes[i].handle_timeout(self.now);
            }
            while let Some(t) = self.nodes[i].poll_transmit() {
                let frame = decode_frame(&t.bytes, &[self.policy]).unwrap();
                for item in &frame.items {
                    let kind = match item {
                        Item::Want(_) => "want",
                        Item::Grant(_) => "grant",
                        Item::Recall { .. } => "recall",
                        Item::Backup(_) => "backup",
                        Item::Members(_) => continue,
                        _ => "other",
                    };
                    *self.items.entry(kind).or_default() += 1;
                }
                let from = self.nodes[i].id();
                let to = self.nodes.iter().position(|n| n.id() == t.to).unwrap();
                self.nodes[to]
                    .handle_frame(self.now, from, &t.bytes)
                    .unwrap();
            }
            while let Some(event) = self.nodes[i].poll_event() {
                if let Event::Decided { decision, .. } = event {
                    self.decided.push(decision.is_allowed());
                }
            }
        }
    }

    fn run_ms(&mut self, ms: u64) {
        for _ in 0..ms {
            self.step();
        }
    }

    /// One request for a key node 2 owns, on node 1, then four seconds of quiet (the key's
    /// life ends on every node); the items it cost.
    fn lone_request(mut self) -> BTreeMap<&'static str, u32> {
        let key = (1..).find(|&k| self.nodes[0].owner_of(k) == 2).unwrap();
        let now = self.now;
        assert!(matches!(
            self.nodes[0].decide(0, key, 1, now),
            Admit::Wait(_)
        ));
        self.run_ms(4000);
        assert_eq!(self.decided, vec![true], "the request is admitted once");
        for node in &self.nodes {
            assert_eq!(
                (node.key_count(), node.authority_count()),
                (0, 0),
                "forgotten"
            );
        }
        self.items
    }
}

fn tally(items: &[(&'static str, u32)]) -> BTreeMap<&'static str, u32> {
    items.iter().copied().collect()
}

#[test]
fn a_fixed_windows_lone_request_costs_a_want_a_grant_and_a_backup() {
    let policy = Policy::global_fixed_window(100, Duration::from_secs(1)).unwrap();
    assert_eq!(
        Three::new(policy).lone_request(),
        tally(&[("backup", 1), ("grant", 1), ("want", 1)])
    );
}

#[test]
fn a_sliding_windows_lone_request_adds_its_final_count_and_that_backup() {
    let policy = Policy::global_sliding_window(100, Duration::from_secs(1)).unwrap();
    assert_eq!(
        Three::new(policy).lone_request(),
        tally(&[("backup", 2), ("grant", 1), ("want", 2)])
    );
}

/// A bucket's lease holds the burst back until its spending is reported, and the holder
/// keeps the key until the owner confirmed that report (a lost one would hold the burst
/// back for good).
#[test]
fn a_buckets_lone_request_reports_its_spending_and_has_it_confirmed() {
    let policy = Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap();
    let items = Three::new(policy).lone_request();
    assert_eq!((items["want"], items["grant"]), (3, 2), "{items:?}");
    assert_eq!(items.get("backup"), None, "{items:?}");
}
