//! The measures of a run (definitions in `docs/overshoot.md` and DESIGN.md section 3).

use std::collections::HashMap;

use crate::clock::Nanos;
use crate::mesh::cell::MeshKind;
use crate::policy::Policy;
use crate::sim::{SimConfig, SimNode, SimReport};

/// Admissions `(true time, cost)` in time order.
type Admissions = Vec<(Nanos, u64)>;

/// Collects decisions while a run goes on.
pub(crate) struct Recorder {
    mesh: Vec<Admissions>,
    oracle: Vec<Admissions>,
    requests: u64,
    wrong: u64,
    pub(crate) partition_share: Option<f64>,
    seen: HashMap<(usize, u64, u64, u64, u64), u64>,
    decreased: bool,
    max_share_sum: f64,
}

impl Recorder {
    pub(crate) fn new(config: &SimConfig) -> Self {
        let keys = config.keys.max(1) as usize;
        Recorder {
            mesh: vec![Vec::new(); keys],
            oracle: vec![Vec::new(); keys],
            requests: 0,
            wrong: 0,
            partition_share: None,
            seen: HashMap::new(),
            decreased: false,
            max_share_sum: 0.0,
        }
    }

    pub(crate) fn request(&mut self, now: Nanos, key: u64, cost: u64, mesh: bool, oracle: bool) {
        self.requests += 1;
        if mesh != oracle {
            self.wrong += 1;
        }
        if mesh {
            self.mesh[key as usize].push((now, cost));
        }
        if oracle {
            self.oracle[key as usize].push((now, cost));
        }
    }

    /// Check that no node's view of any gossiped count went down since the last check (on
    /// the first 16 keys, so a run with many keys stays fast).
    pub(crate) fn check_counters(&mut self, now: Nanos, nodes: &[SimNode], config: &SimConfig) {
        for (i, n) in nodes.iter().enumerate() {
            let Some(node) = &n.node else { continue };
            for key in 0..config.keys.clamp(1, 16) {
                for window in candidate_windows(config, n, now) {
                    let Some(counter) = node.counts(0, key + 1, window) else {
                        continue;
                    };
                    for &(entry, value) in counter.entries() {
                        let slot = self
                            .seen
                            .entry((i, n.incarnation, key, window, entry))
                            .or_insert(0);
                        if value < *slot {
                            self.decreased = true;
                        }
                        *slot = value;
                    }
                }
            }
        }
    }

    /// Record the sum of the running nodes' allowances (the first 16 keys).
    pub(crate) fn check_shares(&mut self, nodes: &[SimNode], config: &SimConfig) {
        for key in 0..config.keys.clamp(1, 16) {
            let sum: f64 = nodes
                .iter()
                .filter_map(|n| n.node.as_ref()?.allowance_share(0, key + 1))
                .map(crate::mesh::share::to_fraction)
                .sum();
            self.max_share_sum = self.max_share_sum.max(sum);
        }
    }

    pub(crate) fn finish(self, config: &SimConfig) -> SimReport {
        let p = &config.policy;
        let kind = MeshKind::of(p).unwrap_or(MeshKind::SlidingWindow);
        let worst = |sets: &[Admissions], f: &dyn Fn(&Admissions) -> f64| {
            sets.iter().map(f).fold(0.0f64, f64::max)
        };
        let exact = |a: &Admissions| exact_overshoot(kind, p, a);
        let own = |a: &Admissions| policy_overshoot(kind, p, a);
        let total = |sets: &[Admissions]| -> u64 {
            sets.iter().flat_map(|a| a.iter().map(|&(_, c)| c)).sum()
        };
        let admitted = total(&self.mesh);
        let oracle_admitted = total(&self.oracle);
        SimReport {
            overshoot: worst(&self.mesh, &exact),
            policy_overshoot: worst(&self.mesh, &own),
            oracle_overshoot: worst(&self.oracle, &exact),
            utilization: if oracle_admitted == 0 {
                1.0
            } else {
                admitted as f64 / oracle_admitted as f64
            },
            wrong_decision_rate: if self.requests == 0 {
                0.0
            } else {
                self.wrong as f64 / self.requests as f64
            },
            partition_share_at_split: self.partition_share,
            requests: self.requests,
            admitted,
            oracle_admitted,
            counter_decreased: self.decreased,
            max_share_sum: self.max_share_sum,
            ..SimReport::default()
        }
    }
}

/// The windows whose counts a node gossips at true time `now`.
fn candidate_windows(config: &SimConfig, n: &SimNode, now: Nanos) -> Vec<u64> {
    let index = config.policy.window_of(n.local(now));
    vec![index.saturating_sub(1), index]
}

/// Overshoot with exact timestamps: `max A([t, t+W)) / L - 1` for windows,
/// `max A(I) / (b + r|I|) - 1` for buckets, floored at 0.
pub fn exact_overshoot(kind: MeshKind, policy: &Policy, admissions: &[(Nanos, u64)]) -> f64 {
    match kind {
        MeshKind::Bucket => bucket_overshoot(policy, admissions),
        _ => {
            let w = policy.window_ns();
            let limit = policy.capacity() as f64;
            let mut best = 0u64;
            let mut sum = 0u64;
            let mut j = 0;
            for i in 0..admissions.len() {
                while j < admissions.len() && admissions[j].0 < admissions[i].0 + w {
                    sum += admissions[j].1;
                    j += 1;
                }
                best = best.max(sum);
                sum -= admissions[i].1;
            }
            (best as f64 / limit - 1.0).max(0.0)
        }
    }
}

/// Overshoot in the policy's own terms, in true time: per aligned window (fixed window), the
/// weighted estimate after each admission (sliding-window counter), the bucket bound.
pub fn policy_overshoot(kind: MeshKind, policy: &Policy, admissions: &[(Nanos, u64)]) -> f64 {
    let limit = policy.capacity() as f64;
    let w = policy.window_ns();
    match kind {
        MeshKind::Bucket => bucket_overshoot(policy, admissions),
        MeshKind::FixedWindow => {
            let mut best = 0u64;
            let mut window = u64::MAX;
            let mut sum = 0;
            for &(t, c) in admissions {
                if t / w != window {
                    window = t / w;
                    sum = 0;
                }
                sum += c;
                best = best.max(sum);
            }
            (best as f64 / limit - 1.0).max(0.0)
        }
        MeshKind::SlidingWindow => {
            let mut best = 0.0f64;
            let (mut window, mut previous, mut current) = (u64::MAX, 0u64, 0u64);
            for &(t, c) in admissions {
                let index = t / w;
                if index != window {
                    previous = if window != u64::MAX && index == window + 1 {
                        current
                    } else {
                        0
                    };
                    current = 0;
                    window = index;
                }
                current += c;
                let elapsed = (t % w) as f64 / w as f64;
                best = best.max(previous as f64 * (1.0 - elapsed) + current as f64);
            }
            // Rounding of the weights: anything within a billionth of the limit is the limit.
            (best / limit - 1.0 - 1e-9).max(0.0)
        }
    }
}

/// `max over intervals I of A(I) / (b + r·|I|) - 1`, by bisection on the ratio: for a given
/// ratio, the worst interval is found in one pass (maximum subarray of `A - c·|I|`).
fn bucket_overshoot(policy: &Policy, admissions: &[(Nanos, u64)]) -> f64 {
    if admissions.is_empty() {
        return 0.0;
    }
    let b = policy.capacity() as f64;
    let r = 1.0 / policy.interval_ns() as f64;
    let exceeds = |ratio: f64| {
        let c = ratio * r;
        let mut before = 0.0f64; // admitted before the current instant
        let mut best_start = f64::INFINITY;
        let mut i = 0;
        while i < admissions.len() {
            let t = admissions[i].0 as f64;
            // An interval may start at this instant: remember the best start.
            best_start = best_start.min(before - c * t);
            let mut at = before;
            while i < admissions.len() && admissions[i].0 as f64 == t {
                at += admissions[i].1 as f64;
                i += 1;
            }
            if at - c * t - best_start > ratio * b * (1.0 + 1e-12) {
                return true;
            }
            before = at;
        }
        false
    };
    if !exceeds(1.0) {
        return 0.0;
    }
    let total: u64 = admissions.iter().map(|&(_, c)| c).sum();
    let (mut low, mut high) = (1.0f64, (total as f64 / b).max(1.0) + 1.0);
    for _ in 0..60 {
        let mid = (low + high) / 2.0;
        if exceeds(mid) {
            low = mid;
        } else {
            high = mid;
        }
    }
    high - 1.0
}

/// The share of the budget held by the side of a partition that has no majority (worst key).
pub(crate) fn minority_share(nodes: &[SimNode], config: &SimConfig) -> f64 {
    let Some(p) = config.partition else {
        return 0.0;
    };
    let n = config.nodes;
    let small_is_first = p.minority * 2 < n;
    let in_small = |i: usize| (i < p.minority) == small_is_first;
    if p.minority * 2 == n {
        return 0.0;
    }
    (0..config.keys.max(1))
        .map(|key| {
            nodes
                .iter()
                .enumerate()
                .filter(|(i, _)| in_small(*i))
                .filter_map(|(_, s)| s.node.as_ref())
                .map(|node| crate::mesh::share::to_fraction(node.share(0, key + 1)))
                .sum::<f64>()
        })
        .fold(0.0, f64::max)
}

/// Time from a heal until every live node holds every other node's own counts as of the heal.
#[derive(Debug, Default)]
pub(crate) struct Convergence {
    heal_ns: Option<Nanos>,
    targets: Vec<(u64, u64, u64, u64)>,
    done_ns: Option<Nanos>,
}

impl Convergence {
    pub(crate) fn start(&mut self, now: Nanos, nodes: &[SimNode], config: &SimConfig) {
        self.heal_ns = Some(now);
        for (j, n) in nodes.iter().enumerate() {
            let Some(node) = &n.node else { continue };
            for key in 0..config.keys.max(1) {
                for window in candidate_windows(config, n, now) {
                    if let Some(c) = node.counts(0, key + 1, window) {
                        let own = c.get(j as u64);
                        if own > 0 {
                            self.targets.push((j as u64, key + 1, window, own));
                        }
                    }
                }
            }
        }
    }

    pub(crate) fn check(&mut self, now: Nanos, nodes: &[SimNode], config: &SimConfig) {
        if self.done_ns.is_some() || self.heal_ns.is_none() {
            return;
        }
        let converged = nodes.iter().enumerate().all(|(i, n)| {
            let Some(node) = &n.node else { return true };
            let current = candidate_windows(config, n, now);
            self.targets.iter().all(|&(j, key, window, own)| {
                j == i as u64
                    || !current.contains(&window)
                    || node.counts(0, key, window).is_some_and(|c| c.get(j) >= own)
            })
        });
        if converged {
            self.done_ns = Some(now);
        }
    }

    pub(crate) fn result_ms(&self) -> Option<f64> {
        Some((self.done_ns? - self.heal_ns?) as f64 / 1e6)
    }
}
