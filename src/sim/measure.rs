//! The measures of a run (definitions in `docs/overshoot.md`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::clock::Nanos;
use crate::mesh::authority::is_retired;
use crate::mesh::message::HolderRecord;
use crate::sim::cut::{Cut, unbacked};
use crate::sim::overshoot::{exact_overshoot, framed_overshoot};
use crate::sim::own_room::OwnRoom;
use crate::sim::traffic::Arrival;
use crate::sim::{START_NS, SimConfig, SimNode, SimReport, declared_bound};

/// Admissions `(true time, cost)`.
type Admissions = Vec<(Nanos, u64)>;

/// The first keys the per-tick checks look at (a run with many keys stays fast).
const CHECKED_KEYS: u64 = 16;

#[derive(Debug, Clone, Copy)]
struct Request {
    key: u64,
    cost: u64,
    at: Nanos,
    /// Its arrival on the oracle's clock (the key owner's).
    oracle_at: Nanos,
    oracle: bool,
    /// The oracle's room for this key just before this request, in tokens.
    room: u64,
    mesh: Option<bool>,
    /// When the mesh decided it (true time).
    decided_at: Nanos,
    /// Its node was down when it arrived, or went down while it waited: an error, denied.
    failed: bool,
}

/// Collects decisions while a run goes on.
pub(crate) struct Recorder {
    mesh: Vec<Admissions>,
    oracle: Vec<Admissions>,
    requests: Vec<Request>,
    waits: Vec<Nanos>,
    /// Per key: (start in true time, window index) of each window the key's authorities
    /// began, as they reported them.
    windows: Vec<Vec<(Nanos, u64)>>,
    crash_at: Option<(Nanos, usize)>,
    /// Drains begun.
    drains: u64,
    /// The last membership event (a crash, drain, stop, restart, split or heal), true time.
    last_event: Nanos,
    /// The most a crashed node held of a key's lease at its crash, over the limit.
    crash_loss: f64,
    /// Per key, what the holdings of nodes an authority could not hear (crashed, or across
    /// a partition) held, in tokens: that side counts it as spent.
    unheard_leases: Vec<u64>,
    /// Crashed nodes' (id, incarnation) at their crash: what the keys' authorities record
    /// of their holdings is looked at until their deaths are declared.
    crashed: Vec<(u64, u64)>,
    /// While the network is split: the first `minority` nodes are on one side.
    split: Option<usize>,
    /// The policy's limit (capacity).
    limit: Option<u64>,
    detected_at: Option<Nanos>,
    crash_term: f64,
    heal_at: Option<Nanos>,
    converged_at: Option<Nanos>,
    double_authority: bool,
    /// The nodes that ran since the last check (a node starts granting only while it runs:
    /// between its runs, time can only end its authority lease).
    ran: Vec<usize>,
    has_run: Vec<bool>,
    /// Per checked key, the nodes that could grant from it when last looked at.
    granting: Vec<Vec<usize>>,
    /// While the network is split (a run with a partition and no other fault): what the
    /// partition term of the bound measures.
    cut: Option<Cut>,
}

impl Recorder {
    pub(crate) fn new(config: &SimConfig, arrivals: &[Arrival]) -> Self {
        let keys = config.keys.max(1) as usize;
        // A key's admissions are at most its arrivals: room for them all at once, rather
        // than each key's list growing by doubling.
        let mut offered = vec![0usize; keys];
        for a in arrivals {
            offered[a.key as usize] += 1;
        }
        let admissions = || offered.iter().map(|&n| Vec::with_capacity(n)).collect();
        Recorder {
            mesh: admissions(),
            oracle: admissions(),
            requests: Vec::with_capacity(arrivals.len()),
            waits: Vec::new(),
            windows: vec![Vec::new(); keys],
            crash_at: None,
            drains: 0,
            last_event: 0,
            crash_loss: 0.0,
            unheard_leases: vec![0; keys],
            crashed: Vec::new(),
            split: None,
            limit: Some(config.policy.capacity()),
            detected_at: None,
            crash_term: 0.0,
            heal_at: None,
            converged_at: None,
            double_authority: false,
            ran: (0..config.nodes).collect(),
            has_run: vec![true; config.nodes],
            granting: vec![Vec::new(); CHECKED_KEYS as usize],
            cut: None,
        }
    }

    /// Node `i` ran (a request, a frame, its timer, a restart).
    pub(crate) fn ran(&mut self, i: usize) {
        if !self.has_run[i] {
            self.has_run[i] = true;
            self.ran.push(i);
        }
    }

    /// A request arrived (arrival `index`, in order) and the oracle decided it.
    pub(crate) fn offered(
        &mut self,
        index: usize,
        key: u64,
        cost: u64,
        oracle: &crate::decision::Decision,
        now: Nanos,
        oracle_at: Nanos,
    ) {
        debug_assert_eq!(index, self.requests.len());
        let allowed = oracle.is_allowed();
        let room = if allowed {
            oracle.remaining + cost
        } else {
            oracle.remaining
        };
        self.requests.push(Request {
            key,
            cost,
            at: now,
            oracle_at,
            oracle: allowed,
            room,
            mesh: None,
            decided_at: 0,
            failed: false,
        });
        let oracle = allowed;
        if oracle {
            self.oracle[key as usize].push((now, cost));
        }
    }

    /// Request `index` failed at `now`: its node was down, or went down while it waited
    /// (denied, and no decision of the mesh's).
    pub(crate) fn failed(&mut self, index: usize, now: Nanos) {
        self.decided(index, now, false, 0);
        self.requests[index].failed = true;
    }

    /// The mesh decided request `index` at `now`, after waiting `waited` ns.
    pub(crate) fn decided(&mut self, index: usize, now: Nanos, allowed: bool, waited: Nanos) {
        let r = &mut self.requests[index];
        if r.mesh.is_some() {
            return;
        }
        r.mesh = Some(allowed);
        r.decided_at = now;
        if allowed {
            self.mesh[r.key as usize].push((now, r.cost));
        }
        if waited > 0 {
            self.waits.push(waited);
        }
    }

    /// An authority of `key` began `window` at true time `start`.
    pub(crate) fn window(&mut self, key: u64, window: u64, start: Nanos) {
        if let Some(frames) = self.windows.get_mut(key as usize) {
            frames.push((start, window));
        }
    }

    /// Node `i` crashes at `now`: measure what its authorities granted that their
    /// successors' backups do not show (the crash term of the bound).
    pub(crate) fn crashed(&mut self, now: Nanos, i: usize, nodes: &[SimNode]) {
        self.crash_at.get_or_insert((now, i));
        self.event(now);
        let Some(node) = &nodes[i].node else { return };
        self.crashed.push((node.id(), node.incarnation()));
        let limit = node.policies()[0].capacity() as f64;
        // What its leases held: the survivors count it as spent (the loss a crash may cost).
        for key in 0..self.mesh.len() as u64 {
            if let Some(lease) = node.lease_state(0, key + 1) {
                self.crash_loss = self.crash_loss.max(lease.unspent as f64 / limit);
                let most = &mut self.unheard_leases[key as usize];
                *most = (*most).max(lease.unspent);
            }
        }
        for key in 0..self.mesh.len() as u64 {
            let Some(a) = node.authority_state(0, key + 1) else {
                continue;
            };
            let (_, successor) = node.membership().owner_and_successor(key + 1);
            let backup = successor
                .and_then(|s| nodes.get(s as usize))
                .and_then(|s| s.node.as_ref())
                .and_then(|s| s.backup(0, key + 1));
            self.crash_term = self.crash_term.max(unbacked(&a, backup) as f64 / limit);
        }
    }

    /// Node `i` ran after a crash or during a partition: what its authorities record as
    /// leased to the holdings of nodes it cannot hear (a crashed node's, grants on their
    /// way at the crash included; the other side's), which they count as spent.
    pub(crate) fn check_unheard(&mut self, i: usize, nodes: &[SimNode]) {
        if self.crashed.is_empty() && self.split.is_none() {
            return;
        }
        let Some(node) = &nodes[i].node else { return };
        let side = |n: u64| self.split.map(|minority| (n as usize) < minority);
        // A crashed node's holding, one across the cut, or one that ended (a retired record:
        // its node restarted or was declared dead) before its lease came back.
        let unheard = |h: &HolderRecord| {
            is_retired(h)
                || self.crashed.contains(&(h.node, h.incarnation))
                || side(h.node) != side(i as u64)
        };
        let keys = (self.mesh.len() as u64).min(CHECKED_KEYS);
        for key in 0..keys {
            let Some(a) = node.authority(0, key + 1) else {
                continue;
            };
            let leased: u64 = a
                .holders()
                .iter()
                .filter(|h| unheard(h))
                .map(|h| h.tally.unspent())
                .sum();
            let most = &mut self.unheard_leases[key as usize];
            *most = (*most).max(leased);
        }
    }

    /// Node `i` began to drain at `now`.
    pub(crate) fn drained(&mut self, now: Nanos, _i: usize) {
        self.drains += 1;
        self.event(now);
    }

    /// A membership event at `now` (a stop, a start, a split, a heal; crashes and drains
    /// note theirs).
    pub(crate) fn event(&mut self, now: Nanos) {
        self.last_event = self.last_event.max(now);
    }

    /// Handoffs lost with a crashed node (on their way to it): what they had leased counts
    /// in the crash term, as grants no successor saw.
    pub(crate) fn handoffs_lost(&mut self, states: &[crate::mesh::message::AuthorityState]) {
        for state in states {
            let Some(limit) = self.limit else { continue };
            let leased: u64 = state
                .holders
                .iter()
                .map(|h| h.tally.granted.saturating_sub(h.tally.returned))
                .sum();
            self.crash_term = self.crash_term.max(leased as f64 / limit as f64);
        }
    }

    /// Some node declared `peer` dead at `now`.
    pub(crate) fn peer_down(&mut self, now: Nanos, peer: usize) {
        if self.detected_at.is_none() && self.crash_at.is_some_and(|(_, i)| i == peer) {
            self.detected_at = Some(now);
        }
    }

    /// The network splits at `now` into the first `minority` nodes and the rest.
    pub(crate) fn split(
        &mut self,
        now: Nanos,
        minority: usize,
        config: &SimConfig,
        nodes: &[SimNode],
    ) {
        self.event(now);
        self.split = Some(minority);
        self.cut = Cut::at_split(
            minority,
            config,
            nodes,
            self.mesh.len() as u64,
            CHECKED_KEYS,
        );
    }

    /// Node `i` ran during a partition: what its authorities leased unseen.
    pub(crate) fn check_cut(&mut self, i: usize, nodes: &[SimNode]) {
        if let Some(cut) = &mut self.cut {
            cut.observe(i, nodes);
        }
    }

    pub(crate) fn heal(&mut self, now: Nanos) {
        self.event(now);
        if let Some(cut) = &mut self.cut {
            cut.heal();
        }
        self.heal_at = Some(now);
        self.split = None;
        self.converged_at = None;
    }

    /// At most one live node may grant from a key at any instant.
    pub(crate) fn check_authorities(&mut self, now: Nanos, nodes: &[SimNode], _partitioned: bool) {
        let keys = (self.mesh.len() as u64).min(CHECKED_KEYS) as usize;
        let can_grant = |i: usize, key: usize| {
            let n = &nodes[i];
            n.node
                .as_ref()
                .is_some_and(|node| node.can_grant(0, key as u64 + 1, n.local(now)))
        };
        // The nodes that ran may have started granting: look at them now.
        for &i in &self.ran {
            self.has_run[i] = false;
            for (key, list) in self.granting.iter_mut().enumerate().take(keys) {
                let listed = list.iter().position(|&j| j == i);
                match (can_grant(i, key), listed) {
                    (true, None) => list.push(i),
                    (false, Some(at)) => {
                        list.swap_remove(at);
                    }
                    _ => {}
                }
            }
        }
        self.ran.clear();
        // The others can only have stopped: where two are listed, look again.
        for (key, list) in self.granting.iter_mut().enumerate().take(keys) {
            if list.len() > 1 {
                list.retain(|&j| can_grant(j, key));
                if list.len() > 1 {
                    self.double_authority = true;
                }
            }
        }
    }

    /// After a heal: the live nodes agree on every key's owner.
    pub(crate) fn check_convergence(&mut self, now: Nanos, nodes: &[SimNode]) {
        if self.converged_at.is_some() || self.heal_at.is_none() {
            return;
        }
        let agreed = (0..(self.mesh.len() as u64).min(CHECKED_KEYS)).all(|key| {
            let mut owners = nodes
                .iter()
                .filter_map(|n| n.node.as_ref())
                .map(|node| node.owner_of(key + 1));
            let first = owners.next();
            owners.all(|o| Some(o) == first)
        });
        let all_alive = nodes.iter().filter_map(|n| n.node.as_ref()).all(|node| {
            node.members().iter().all(|&(_, alive)| alive) || nodes.iter().any(|n| n.node.is_none())
        });
        if agreed && all_alive {
            self.converged_at = Some(now);
        }
    }

    pub(crate) fn finish(mut self, config: &SimConfig, _arrivals: &[Arrival]) -> SimReport {
        let p = &config.policy;
        let bucket = p.algorithm().is_bucket();
        for a in &mut self.mesh {
            a.sort_unstable();
        }
        let mut overshoot = 0.0f64;
        let mut policy_over = 0.0f64;
        let mut oracle_over = 0.0f64;
        for (k, a) in self.mesh.iter().enumerate() {
            overshoot = overshoot.max(exact_overshoot(p, a));
            policy_over = policy_over.max(framed_overshoot(p, a, &self.windows[k]));
        }
        for a in &self.oracle {
            oracle_over = oracle_over.max(exact_overshoot(p, a));
        }
        let total = |sets: &[Admissions]| -> u64 {
            sets.iter().flat_map(|a| a.iter().map(|&(_, c)| c)).sum()
        };
        let admitted = total(&self.mesh);
        let oracle_admitted = total(&self.oracle);
        let mut denied_by_oracle = vec![false; self.mesh.len()];
        for r in &self.requests {
            if !r.oracle {
                denied_by_oracle[r.key as usize] = true;
            }
        }
        let (mut decided, mut wrong, mut false_denials, mut false_admits, mut oracle_yes) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let (mut under_denials, mut under_yes) = (0u64, 0u64);
        for r in &self.requests {
            let Some(mesh) = r.mesh else { continue };
            decided += 1;
            if mesh != r.oracle {
                wrong += 1;
            }
            if r.oracle {
                oracle_yes += 1;
                if !denied_by_oracle[r.key as usize] {
                    under_yes += 1;
                }
                if !mesh {
                    false_denials += 1;
                    if !denied_by_oracle[r.key as usize] {
                        under_denials += 1;
                    }
                }
            } else if mesh {
                false_admits += 1;
            }
        }
        // Denials although the oracle had room for the request, for everything offered for its
        // key within one round and two trips of it either side, and for what the policy's
        // rate adds in one round (a bucket: and in one trip, the refill its authority cannot
        // give back for tokens spent before their report arrived, as far as the clocks
        // cannot tell when).
        let trip = config.latency_ns + config.jitter_ns;
        let margin = config.gossip_interval_ns + 2 * trip;
        let round_tokens = if bucket {
            (config.gossip_interval_ns + trip).div_ceil(p.interval_ns())
        } else {
            (u128::from(p.capacity()) * u128::from(config.gossip_interval_ns))
                .div_ceil(u128::from(p.window_ns())) as u64
        };
        let starts = group_by_key(&mut self.requests, self.mesh.len());
        let mut with_room = 0u64;
        let mut refused = 0u64;
        // A crashed node's lease weighs until its death is declared and settled, and for
        // the windows it was granted in (a sliding window's next weighs the one before; a
        // bucket refills from empty in its window).
        let weighs = 2 * config.dead_after_rounds * config.gossip_interval_ns
            + config.max_wait_ns
            + 2 * p.window_ns();
        let crash_weighs_until = self.crash_at.map_or(0, |(at, _)| at + weighs);
        // A partition's: until its heal is settled likewise (the end of the run if it lasts).
        let cut_weighs_until = match (config.partition, self.heal_at) {
            (None, _) => 0,
            (Some(_), Some(healed)) => healed + weighs,
            (Some(_), None) => Nanos::MAX,
        };
        let unheard_weighs_until = crash_weighs_until.max(cut_weighs_until);
        // The budget lost: at the last decision of each window (a bucket: of the run) once
        // the membership events are over and settled (failure detection twice over, a
        // wait), if it was a denial, the room one central limiter that admitted what the
        // mesh admitted would still have had, beyond what was offered around it.
        let mut lost = 0u64;
        let settled = if self.last_event == 0 {
            0
        } else {
            self.last_event
                + 2 * config.dead_after_rounds * config.gossip_interval_ns
                + config.max_wait_ns
        };
        for (key, span) in starts.windows(2).enumerate() {
            let requests = &self.requests[span[0]..span[1]];
            let mut own = OwnRoom::new(p, &self.mesh[key]);
            // What was offered for the key before each request, in arrival order.
            let offered: Vec<u64> = std::iter::once(0)
                .chain(requests.iter().scan(0u64, |sum, q| {
                    *sum += q.cost;
                    Some(*sum)
                }))
                .collect();
            // When the key's authorities began their windows (true time), in order.
            let mut frames: Vec<Nanos> = self
                .windows
                .get(key)
                .map_or_else(Vec::new, |w| w.iter().map(|&(start, _)| start).collect());
            frames.sort_unstable();
            let (mut lo, mut hi, mut sum) = (0usize, 0usize, 0u64);
            // Requests offered before the margin that the mesh admits only after this
            // arrival (they waited longer than the margin, across a window's end), or that
            // still wait when the run ends: the mesh's own room has that much less for this
            // one. By admission time, earliest first.
            let mut pending: BinaryHeap<Reverse<(Nanos, u64)>> = BinaryHeap::new();
            let mut pending_cost = 0u64;
            let mut last_denial: Vec<(u64, u64)> = Vec::new();
            for r in requests {
                let own_room = own.at(r.at, r.oracle_at);
                while hi < requests.len() && requests[hi].at <= r.at + margin {
                    sum += requests[hi].cost;
                    hi += 1;
                }
                while requests[lo].at + margin < r.at {
                    let left = requests[lo];
                    sum -= left.cost;
                    // Still waiting when the run ended: it would be served before this one
                    // (as one central limiter serves its queue), whatever its answer.
                    let admitted_at = match left.mesh {
                        Some(true) => Some(left.decided_at),
                        None => Some(Nanos::MAX),
                        Some(false) => None,
                    };
                    if let Some(at) = admitted_at {
                        pending.push(Reverse((at, left.cost)));
                        pending_cost += left.cost;
                    }
                    lo += 1;
                }
                while let Some(&Reverse((at, cost))) = pending.peek() {
                    if at >= r.at {
                        break;
                    }
                    pending.pop();
                    pending_cost -= cost;
                }
                let own_room = own_room.saturating_sub(pending_cost);
                // A window's end, within a round, a recall (two round trips) and a holder's
                // clock error (half a round trip) of it: the request may be decided in the
                // next window (a holder's lease ends early by its clock error; recalled tokens
                // may come back after it ended; the owner may answer after the window ended).
                // Not counted.
                let w = p.window_ns();
                let edge = config.gossip_interval_ns + 5 * trip;
                let at_edge = !bucket && r.oracle_at % w + edge >= w;
                // And, once ownership may have moved (a drain, a crash, a partition), a
                // window's start within the same margin: a window handed over begins that much
                // later on its new owner than on the one it came from (never earlier), and the
                // oracle's follows the first owner's clock.
                let moved = self.last_event != 0;
                let at_start = !bucket && moved && r.oracle_at % w < edge;
                // `sum` includes this request's own cost.
                // Room by the oracle's history and by the mesh's own (a mesh that admitted
                // what the oracle denied earlier has that much less room later).
                if r.mesh == Some(false)
                    && r.room.min(own_room) >= sum + round_tokens
                    && !at_edge
                    && !at_start
                {
                    with_room += 1;
                    // Refused, not timed out: beyond what the leases of nodes its authority
                    // could not hear held (counted spent there) while they may still weigh;
                    // with clocks a twentieth of a window apart or more, once ownership may
                    // have moved, not measurable (the oracle follows the first owner's clock).
                    let lost = if r.at < unheard_weighs_until {
                        self.unheard_leases[key]
                    } else {
                        0
                    };
                    // Its answer came near its window's end (a wait that loss made long): as
                    // at its arrival, the room may not come back in time.
                    let waited = r.decided_at.saturating_sub(r.at);
                    let answered_at = r.oracle_at + waited;
                    let answered_at_edge = !bucket
                        && (answered_at / w != r.oracle_at / w || answered_at % w + edge >= w);
                    let close_clocks = !moved || 20 * config.skew_ns < w;
                    // What was offered from the margin before it to the margin after its
                    // answer: a request that waits (its want lost and sent again) may be
                    // overtaken by those that arrive meanwhile and reach the owner first.
                    let during_wait = || {
                        let until = r.decided_at.max(r.at) + margin;
                        let end = requests.partition_point(|q| q.at <= until);
                        offered[end.max(lo)] - offered[lo]
                    };
                    // Its window as the key's authority framed it began within the margin of
                    // the oracle's (an owner that took the key over without a backup follows
                    // the dead owner's clock as far as it knows it: up to the failure
                    // detection time late).
                    let framed = bucket || {
                        let i = frames.partition_point(|&start| start <= r.at);
                        i == 0 || {
                            let aligned = r.at - r.oracle_at % w;
                            frames[i - 1].abs_diff(aligned) <= edge
                        }
                    };
                    if !r.failed
                        && close_clocks
                        && framed
                        && waited < config.max_wait_ns
                        && !answered_at_edge
                        && r.room.min(own_room) >= during_wait() + round_tokens + lost
                    {
                        refused += 1;
                    }
                }
                // The room at a denial that no admission follows in its window: what the
                // cluster will not give any more (a denial that one follows was late, not
                // lost budget).
                let window = if bucket { 0 } else { r.oracle_at / w };
                // Its start, within the same margin and the clocks' skew: the cluster's window
                // may begin that much later than the oracle's (an owner's windows follow the
                // clock of the one it took the key from).
                let at_start = at_start || (!bucket && r.oracle_at % w < edge + 2 * config.skew_ns);
                let room = match r.mesh {
                    Some(false) if !at_edge && !at_start && r.at >= settled => {
                        own_room.saturating_sub(sum + round_tokens)
                    }
                    _ => 0,
                };
                if r.mesh.is_some() {
                    match last_denial.last_mut() {
                        Some(last) if last.0 == window => last.1 = room,
                        _ => last_denial.push((window, room)),
                    }
                }
            }
            lost = lost.max(last_denial.iter().map(|&(_, room)| room).max().unwrap_or(0));
        }
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        self.waits.sort_unstable();
        let percentile = |q: f64| -> f64 {
            if self.waits.is_empty() {
                return 0.0;
            }
            let i = ((self.waits.len() - 1) as f64 * q).round() as usize;
            self.waits[i] as f64 / 1e6
        };
        let mut report = SimReport {
            overshoot,
            policy_overshoot: policy_over,
            oracle_overshoot: oracle_over,
            utilization: if oracle_admitted == 0 {
                1.0
            } else {
                admitted as f64 / oracle_admitted as f64
            },
            wrong_decision_rate: ratio(wrong, decided),
            false_denial_rate: ratio(false_denials, oracle_yes),
            false_admit_rate: ratio(false_admits, decided),
            false_denial_rate_under_limit_keys: ratio(under_denials, under_yes),
            waited_fraction: ratio(self.waits.len() as u64, decided),
            wait_p50_ms: percentile(0.5),
            wait_p99_ms: percentile(0.99),
            requests: self.requests.len() as u64,
            admitted,
            oracle_admitted,
            double_authority: self.double_authority,
            false_denials_with_room: with_room,
            refused_with_room: refused,
            budget_lost: lost as f64 / p.capacity() as f64,
            crash_loss: self.crash_loss,
            drains: self.drains,
            convergence_ms_after_heal: match (self.heal_at, self.converged_at) {
                (Some(h), Some(c)) => Some((c - h) as f64 / 1e6),
                _ => None,
            },
            ..SimReport::default()
        };
        report.declared_bound = declared_bound(config);
        report.declared_bound.crash = self.crash_term;
        if config.partition.is_some() {
            // The most any key's cut-off authorities leased unseen, summed over the windows
            // they leased in (a sliding window weighs the one before), over the limit; at
            // most one limit.
            report.declared_bound.partition =
                self.cut.as_ref().map_or(1.0, |cut| cut.term(p.capacity()));
        }
        if let Some((crash, _)) = self.crash_at {
            let end = START_NS + config.duration_ns;
            let span = (2 * p.window_ns()).max(2_000_000_000);
            let until = (crash + span).min(end);
            let sum = |sets: &[Admissions], from: Nanos, to: Nanos| -> u64 {
                sets.iter()
                    .flat_map(|a| a.iter())
                    .filter(|&&(t, _)| t >= from && t < to)
                    .map(|&(_, c)| c)
                    .sum()
            };
            let oracle_after = sum(&self.oracle, crash, until);
            report.capacity_after_crash = Some(if oracle_after == 0 {
                1.0
            } else {
                sum(&self.mesh, crash, until) as f64 / oracle_after as f64
            });
            report.detection_ms = self.detected_at.map(|d| (d - crash) as f64 / 1e6);
            let detected = self.detected_at.unwrap_or(crash);
            let step = 50_000_000;
            let mut last_short = None;
            let mut t = crash + step;
            while t <= until {
                let o = sum(&self.oracle, crash, t);
                let m = sum(&self.mesh, crash, t);
                if o > 0 && (m as f64) < 0.95 * o as f64 {
                    last_short = Some(t);
                }
                t += step;
            }
            report.recovery_ms_after_detection =
                Some(last_short.map_or(0.0, |t| t.saturating_sub(detected) as f64 / 1e6));
        }
        report
    }
}

/// Group `requests` by key in place, each key's in the order they were offered, and return
/// where each key's begin (`keys + 1` offsets): a counting sort whose permutation is applied
/// cycle by cycle, so the per-key pass reads them in order rather than jumping across the
/// whole run's, without a second copy of them.
fn group_by_key(requests: &mut [Request], keys: usize) -> Vec<usize> {
    let mut starts = vec![0usize; keys + 1];
    for r in requests.iter() {
        starts[r.key as usize + 1] += 1;
    }
    for k in 0..keys {
        starts[k + 1] += starts[k];
    }
    // `from[j]`: where the request that goes to `j` is now.
    let mut next = starts.clone();
    let mut from = vec![0usize; requests.len()];
    for (i, r) in requests.iter().enumerate() {
        let slot = &mut next[r.key as usize];
        from[*slot] = i;
        *slot += 1;
    }
    const DONE: usize = usize::MAX;
    for start in 0..requests.len() {
        if from[start] == DONE {
            continue;
        }
        let first = requests[start];
        let mut j = start;
        loop {
            let src = std::mem::replace(&mut from[j], DONE);
            if src == start {
                requests[j] = first;
                break;
            }
            requests[j] = requests[src];
            j = src;
        }
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key: u64, at: Nanos) -> Request {
        Request {
            key,
            cost: 1,
            at,
            oracle_at: at,
            oracle: true,
            room: 0,
            mesh: None,
            decided_at: 0,
            failed: false,
        }
    }

    #[test]
    fn grouping_by_key_keeps_each_keys_order_and_loses_nothing() {
        let mut rng = fastrand::Rng::with_seed(7);
        let keys = 13;
        let offered: Vec<Request> = (0..2_000).map(|t| request(rng.u64(0..keys), t)).collect();
        let mut grouped = offered.clone();
        let starts = group_by_key(&mut grouped, keys as usize);
        assert_eq!(starts.len(), keys as usize + 1);
        assert_eq!(starts[keys as usize], offered.len());
        for (key, span) in starts.windows(2).enumerate() {
            let expected: Vec<Nanos> = offered
                .iter()
                .filter(|r| r.key == key as u64)
                .map(|r| r.at)
                .collect();
            let got: Vec<Nanos> = grouped[span[0]..span[1]]
                .iter()
                .inspect(|r| assert_eq!(r.key, key as u64))
                .map(|r| r.at)
                .collect();
            assert_eq!(got, expected, "key {key}");
        }
    }
}
