//! The rules the simulator compares the mesh with. Each node of a baseline run is a
//! [`crate::mesh::Node`] (its membership, heartbeats and failure detection, so the rule pays
//! the same gossip and sees the same faults) beside a [`Baseline`] that decides its requests;
//! the `stale_sum` counts ride each round's frames on the simulated links, never the wire:
//!
//! - `local_only`: every node enforces the whole limit alone (up to N times the limit);
//! - `static_split`: every node enforces `limit / N` (denies skewed traffic it could admit);
//! - `stale_sum`: a node admits while the cluster's count as it last heard it, plus its own,
//!   stays within the limit (windows), or charges the others' admissions into its own bucket
//!   as it hears of them (buckets). Below the limit it denies nothing; above it, every node
//!   spends the whole remaining budget during one gossip interval.

use crate::algorithm::KeyMachine;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::mesh::NodeId;
use crate::mesh::cells::scaled;
use crate::mesh::keymap::FixedMap;
use crate::mesh::message::KeyRef;
use crate::policy::{Algorithm, Policy};

/// How the simulated nodes decide admission. Only [`Admission::Leases`] (the mesh) is
/// bounded; the others are the baselines it is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// Leases from each key's authority (the bounded rule).
    #[default]
    Leases,
    /// Every node enforces the full limit alone.
    LocalOnly,
    /// Every node enforces `limit / cluster_size`.
    StaticSplit,
    /// Admit while the last-known global count is under the limit.
    StaleSum,
}

impl Admission {
    /// Tell whether the rule needs messages between nodes (`local_only` and `static_split`
    /// decide from what one node sees alone).
    pub fn talks(self) -> bool {
        matches!(self, Admission::Leases | Admission::StaleSum)
    }
}

/// A node's own counts of a key, for the `stale_sum` baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode)]
pub(crate) struct Count {
    /// The key.
    pub(crate) key: KeyRef,
    /// The window of `current` (windows).
    pub(crate) window: u64,
    /// The sender's count in `window`.
    pub(crate) current: u64,
    /// The sender's count in `window − 1`.
    pub(crate) previous: u64,
    /// The sender's admissions ever (buckets).
    pub(crate) total: u64,
}

/// The bytes `counts` add to the frame they ride on (each as an item would take).
pub(crate) fn counts_len(counts: &[Count]) -> usize {
    counts
        .iter()
        .map(|c| 1 + crate::mesh::wire::encoded_len(c))
        .sum()
}

#[derive(Debug)]
struct BaseKey {
    machine: Option<KeyMachine>,
    /// `stale_sum`, windows: this node's (window, current, previous) counts.
    own: (u64, u64, u64),
    /// `stale_sum`, windows: the others' latest (window, current, previous).
    others: SmallMap<(u64, u64, u64)>,
    /// `stale_sum`, buckets: this node's cumulative admissions, and the others' as heard.
    own_total: u64,
    others_total: SmallMap<u64>,
    /// `stale_sum`, buckets: free tokens in ns of refill, as of `at`.
    level_ns: u64,
    at: Nanos,
    changed: bool,
}

/// The baseline rules' per-key state on one node.
#[derive(Debug)]
pub(crate) struct Baseline {
    rule: Admission,
    nodes: usize,
    policies: Vec<Policy>,
    keys: FixedMap<KeyRef, BaseKey>,
    /// `stale_sum`: the keys whose counts changed since the last round, each once.
    changed: Vec<KeyRef>,
}

impl Baseline {
    /// The state of `rule` for a cluster of `nodes` enforcing `policies`.
    pub(crate) fn new(rule: Admission, nodes: usize, policies: Vec<Policy>) -> Self {
        Baseline {
            rule,
            nodes,
            policies,
            keys: FixedMap::default(),
            changed: Vec::new(),
        }
    }

    fn entry(&mut self, key: KeyRef, now: Nanos) -> (&mut BaseKey, Policy) {
        let policy = self.policies[key.policy as usize];
        let rule = self.rule;
        let nodes = self.nodes;
        let k = self.keys.entry(key).or_insert_with(|| BaseKey {
            machine: match rule {
                Admission::LocalOnly => Some(KeyMachine::new(policy)),
                Admission::StaticSplit => Some(KeyMachine::new(scaled(&policy, nodes))),
                _ => None,
            },
            own: (0, 0, 0),
            others: SmallMap::default(),
            own_total: 0,
            others_total: SmallMap::default(),
            level_ns: policy.window_ns(),
            at: now,
            changed: false,
        });
        (k, policy)
    }

    /// Decide a request at `now`.
    pub(crate) fn decide(&mut self, key: KeyRef, cost: u64, now: Nanos) -> Decision {
        let (decision, changed) = self.decide_key(key, cost, now);
        if changed {
            self.changed.push(key);
        }
        decision
    }

    /// Decide a request at `now`; tell whether the key's counts changed for the first time
    /// since the last round.
    fn decide_key(&mut self, key: KeyRef, cost: u64, now: Nanos) -> (Decision, bool) {
        let (k, policy) = self.entry(key, now);
        if cost == 0 || cost > policy.capacity() {
            return (Decision::cannot_fit(policy.capacity()), false);
        }
        if let Some(machine) = &mut k.machine {
            return (machine.decide(now, cost), false);
        }
        let limit = policy.capacity();
        match policy.algorithm() {
            Algorithm::TokenBucket | Algorithm::Gcra => {
                refill(k, &policy, now);
                let need = cost.saturating_mul(policy.interval_ns());
                if k.level_ns >= need {
                    k.level_ns -= need;
                    k.own_total += cost;
                    let newly = !std::mem::replace(&mut k.changed, true);
                    (
                        Decision::allowed(limit, k.level_ns / policy.interval_ns(), 0),
                        newly,
                    )
                } else {
                    (Decision::denied(limit, 0, 0, need - k.level_ns), false)
                }
            }
            algorithm => {
                let window = policy.window_of(now);
                roll(&mut k.own, window);
                let w = policy.window_ns();
                let elapsed = now % w;
                let estimate = |(win, cur, prev): (u64, u64, u64)| -> u64 {
                    let (cur, prev) = if win == window {
                        (cur, prev)
                    } else if win + 1 == window {
                        (0, cur)
                    } else {
                        (0, 0)
                    };
                    let weighted = if algorithm == Algorithm::SlidingWindow {
                        (u128::from(prev) * u128::from(w - elapsed)).div_ceil(u128::from(w)) as u64
                    } else {
                        0
                    };
                    weighted + cur
                };
                let total: u64 =
                    estimate(k.own) + k.others.0.iter().map(|&(_, c)| estimate(c)).sum::<u64>();
                if total + cost <= limit {
                    k.own.1 += cost;
                    let newly = !std::mem::replace(&mut k.changed, true);
                    (
                        Decision::allowed(limit, limit - total - cost, w - elapsed),
                        newly,
                    )
                } else {
                    (Decision::denied(limit, 0, w - elapsed, w - elapsed), false)
                }
            }
        }
    }

    /// Return this node's counts of the keys that changed since the last call (`stale_sum`).
    pub(crate) fn changed_counts(&mut self) -> Vec<Count> {
        if self.rule != Admission::StaleSum {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(self.changed.len());
        for key in self.changed.drain(..) {
            if let Some(k) = self.keys.get_mut(&key)
                && std::mem::take(&mut k.changed)
            {
                out.push(Count {
                    key,
                    window: k.own.0,
                    current: k.own.1,
                    previous: k.own.2,
                    total: k.own_total,
                });
            }
        }
        out
    }

    /// Apply a peer's counts (`stale_sum`).
    pub(crate) fn apply(&mut self, from: NodeId, count: &Count, now: Nanos) {
        if self.rule != Admission::StaleSum || count.key.policy as usize >= self.policies.len() {
            return;
        }
        let (k, policy) = self.entry(count.key, now);
        if policy.algorithm().is_bucket() {
            let seen = k.others_total.entry(from);
            if count.total > *seen {
                let spent = count.total - *seen;
                *seen = count.total;
                refill(k, &policy, now);
                k.level_ns = k
                    .level_ns
                    .saturating_sub(spent.saturating_mul(policy.interval_ns()));
            }
        } else {
            let slot = k.others.entry(from);
            if (count.window, count.current) > (slot.0, slot.1) {
                *slot = (count.window, count.current, count.previous);
            }
        }
    }

    /// Forget a peer's counts (it restarted).
    pub(crate) fn forget(&mut self, from: NodeId) {
        for k in self.keys.values_mut() {
            k.others.remove(from);
            k.others_total.remove(from);
        }
    }
}

fn refill(k: &mut BaseKey, policy: &Policy, now: Nanos) {
    if now > k.at {
        k.level_ns = k
            .level_ns
            .saturating_add(now - k.at)
            .min(policy.window_ns());
        k.at = now;
    }
}

fn roll(own: &mut (u64, u64, u64), window: u64) {
    if own.0 == window {
        return;
    }
    own.2 = if own.0 + 1 == window { own.1 } else { 0 };
    own.1 = 0;
    own.0 = window;
}

/// A key's counts per peer: a handful of peers use a key (a map per key would cost more
/// than its few entries).
#[derive(Debug, Clone)]
struct SmallMap<V>(Vec<(NodeId, V)>);

impl<V> Default for SmallMap<V> {
    fn default() -> Self {
        SmallMap(Vec::new())
    }
}

impl<V: Default> SmallMap<V> {
    /// The value of `peer`, made (default) if absent.
    fn entry(&mut self, peer: NodeId) -> &mut V {
        let i = match self.0.iter().position(|(p, _)| *p == peer) {
            Some(i) => i,
            None => {
                self.0.push((peer, V::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }

    fn remove(&mut self, peer: NodeId) {
        self.0.retain(|(p, _)| *p != peer);
    }
}
