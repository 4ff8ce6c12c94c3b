//! The holders' records of an authority, and how they merge.
//!
//! A record counts one holding of one node (a holder's lease of the key, from its first
//! want until the node dies, leaves, restarts or forgets the key): cumulative counts of what
//! it was granted, gave back and spent, merged by maximum. A holding that ends is *retired*:
//! its record stays, under an id of its own ([`retired_id`]) that every node derives alike,
//! so that it counts once whatever reaches the authority later: a state of another node
//! that still holds the record live (a backup, a handoff, an authority of the other side of
//! a partition), or the holding's own late report (a leaving node's final one, a node
//! declared dead that was only cut off). A window counts what a retired holding leased
//! (less what it reported given back); a bucket no longer holds its burst back for it.
//!
//! On the wire a retired record is a holder record with incarnation 0 and its retired id
//! for a node, which is how every version of the protocol has sent the records of
//! departed holders.

use crdts::CvRDT;

use super::Authority;
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::membership::mix;
use crate::mesh::message::{HolderRecord, Want};
use crate::mesh::tally::Tally;
use crate::mesh::windows::MeshPolicy;

/// How many retired records a bucket keeps (72 bytes each; a window keeps its own until
/// they count nothing, two windows at most).
const MAX_RETIRED: usize = 32;

/// Node ids from here up name retired holdings, never a member (member ids are below).
const RETIRED_IDS: NodeId = crate::ids::MAX_NODE_ID + 1;

/// The id a holding's record keeps once retired: the same on every node.
pub(crate) fn retired_id(node: NodeId, incarnation: u64, holding: u64) -> NodeId {
    RETIRED_IDS | (mix(node ^ mix(incarnation ^ mix(holding))) >> 1)
}

/// Tell whether a record is retired (its holding ended).
pub(crate) fn is_retired(h: &HolderRecord) -> bool {
    h.incarnation == 0
}

/// The holding a record counts, as one id: the same for its live and its retired record.
pub(crate) fn holding_id(h: &HolderRecord) -> NodeId {
    if is_retired(h) {
        h.node
    } else {
        retired_id(h.node, h.incarnation, h.holding)
    }
}

/// Fold `theirs` into `mine`, two records of one holding: their tallies merged (each count
/// its largest); a final count of the previous window (exact) over an upper bound of it.
fn absorb(mine: &mut HolderRecord, theirs: &HolderRecord) {
    mine.tally.merge(theirs.tally);
    mine.closed |= theirs.closed;
    match (mine.previous_final, theirs.previous_final) {
        (false, true) => {
            mine.previous_held = theirs.previous_held;
            mine.previous_final = true;
        }
        (true, false) => {}
        _ => mine.previous_held = mine.previous_held.max(theirs.previous_held),
    }
}

impl Authority {
    /// Fold in a state another node kept for the same key (a handoff back, or two
    /// authorities after a disagreement): each holding's record keeps its largest counts
    /// (retired where either state retired it, unless this node keeps it live), the window
    /// is the newer one. A bucket's level is that of the state that saw more of the key's
    /// traffic (more tokens granted and given back: a state left behind, by a partition or a
    /// handoff, only refilled meanwhile), less what the other state's records show beyond
    /// it (grants and returns made there since the two parted, which moved tokens out of or
    /// back into the other's level).
    ///
    /// Windows: the newer window's state, with the older state's counts of the window before
    /// it folded into its previous window (each holding's largest, a final count over an
    /// upper bound), as the older state would have rolled them: a sliding window weighs
    /// them, and a state that rolled apart from the other must not forget what was admitted
    /// there.
    pub(crate) fn merge(&mut self, policy: &MeshPolicy, other: &Authority) {
        if policy.algorithm().counts_per_window() && other.window != self.window {
            let (newer, older) = if other.window > self.window {
                (other, &*self)
            } else {
                (&*self, other)
            };
            let mut rolled = older.clone();
            rolled.roll(policy, newer.start);
            let mut merged = newer.clone();
            if rolled.window == newer.window {
                merged.merge(policy, &rolled);
            }
            merged.version = self.version.max(other.version) + 1;
            *self = merged;
            return;
        }
        // What each state's records show beyond the other's (a bucket's level, below).
        let traffic = |a: &Authority| -> u64 { a.holders.iter().map(|h| h.tally.traffic()).sum() };
        let (seen_here, seen_there) = (traffic(self), traffic(other));
        let (mut mine_out, mut mine_back) = (0u64, 0u64);
        for mine in &self.holders {
            let id = holding_id(mine);
            match other.holders.iter().find(|h| holding_id(h) == id) {
                Some(theirs) => {
                    let (granted, returned) = mine.tally.beyond(&theirs.tally);
                    mine_out += granted;
                    mine_back += returned;
                }
                None => {
                    mine_out += mine.tally.granted;
                    mine_back += mine.tally.returned;
                }
            }
        }
        let (mut out, mut back) = (0u64, 0u64);
        for theirs in &other.holders {
            let id = holding_id(theirs);
            if let Some(mine) = self.holders.iter_mut().find(|h| holding_id(h) == id) {
                let (granted, returned) = theirs.tally.beyond(&mine.tally);
                out += granted;
                back += returned;
                absorb(mine, theirs);
                continue;
            }
            out += theirs.tally.granted;
            back += theirs.tally.returned;
            if is_retired(theirs) {
                self.keep_retired(policy, *theirs);
                continue;
            }
            // A live holding this state has no record of: the newer of it and the node's
            // holding here stays live, the other is retired.
            match self.live_index(theirs.node) {
                Some(i) => {
                    let mine = self.holders[i];
                    if (mine.incarnation, mine.holding) < (theirs.incarnation, theirs.holding) {
                        self.holders[i] = *theirs;
                        self.retire(policy, mine);
                    } else {
                        self.retire(policy, *theirs);
                    }
                }
                None => {
                    let at = self.holders.partition_point(|h| h.node < theirs.node);
                    self.holders.insert(at, *theirs);
                }
            }
        }
        if policy.algorithm().weighs_previous() {
            // The previous window's count is its holdings' counts, each merged above.
            self.previous = self.holders.iter().map(|h| h.previous_held).sum();
        }
        if policy.algorithm().is_bucket() {
            let interval = self.interval(policy);
            if seen_there > seen_here {
                (self.level_ns, self.level_at) = (other.level_ns, other.level_at);
                (out, back) = (mine_out, mine_back);
            }
            // Net of the two (a level floored at 0 first would count returns twice).
            self.level_ns = if out >= back {
                self.level_ns
                    .saturating_sub((out - back).saturating_mul(interval))
            } else {
                self.level_ns
                    .saturating_add((back - out).saturating_mul(interval))
                    .min(policy.window_ns())
            };
        }
        self.end = self.end.min(other.end);
        self.next_start = self.next_start.max(other.next_start);
        self.capped_since = None;
        self.version = self.version.max(other.version) + 1;
    }

    /// Where the live record of `node` is.
    fn live_index(&self, node: NodeId) -> Option<usize> {
        self.holders.binary_search_by_key(&node, |h| h.node).ok()
    }

    pub(super) fn record_mut(
        &mut self,
        policy: &MeshPolicy,
        node: NodeId,
        incarnation: u64,
    ) -> &mut HolderRecord {
        let i = match self.holders.binary_search_by_key(&node, |h| h.node) {
            Ok(i) => {
                if self.holders[i].incarnation != incarnation {
                    // A restarted holder: its old holding is retired.
                    self.forget_holder_at(policy, i);
                    let at = self.holders.partition_point(|h| h.node < node);
                    self.holders.insert(at, blank(node, incarnation));
                    at
                } else {
                    i
                }
            }
            Err(i) => {
                self.holders.insert(i, blank(node, incarnation));
                i
            }
        };
        &mut self.holders[i]
    }

    /// A holder is gone (dead, left, or restarted): whatever it did not report counts as
    /// spent until it does, and a bucket's burst is no longer held back for it.
    pub(crate) fn forget_holder(&mut self, policy: &MeshPolicy, node: NodeId) {
        if let Some(i) = self.live_index(node) {
            self.forget_holder_at(policy, i);
            self.version += 1;
        }
        self.waiting.retain(|w| w.node != node);
    }

    /// Retire the live records of the holders `alive` does not count as live members (by
    /// node and incarnation): a state that came from another node may still hold records of
    /// holders this node knows are gone.
    pub(crate) fn retire_departed(
        &mut self,
        policy: &MeshPolicy,
        alive: impl Fn(NodeId, u64) -> bool,
    ) {
        let gone: Vec<NodeId> = self
            .holders
            .iter()
            .filter(|h| !is_retired(h) && !alive(h.node, h.incarnation))
            .map(|h| h.node)
            .collect();
        for node in gone {
            self.forget_holder(policy, node);
        }
    }

    fn forget_holder_at(&mut self, policy: &MeshPolicy, i: usize) {
        let h = self.holders.remove(i);
        self.retire(policy, h);
    }

    /// Keep `h`'s holding as a retired record.
    fn retire(&mut self, policy: &MeshPolicy, h: HolderRecord) {
        if is_retired(&h) {
            self.keep_retired(policy, h);
            return;
        }
        self.keep_retired(
            policy,
            HolderRecord {
                node: retired_id(h.node, h.incarnation, h.holding),
                incarnation: 0,
                demand: 0,
                ..h
            },
        );
    }

    /// Keep a retired record (merged with the one of the same holding, if any). A window
    /// counts its leases; a bucket needs it to merge states exactly (a state that still
    /// shows the holding live took its grants from the same level) and to take back what a
    /// late report gives back: it keeps [`MAX_RETIRED`] of them, those with nothing
    /// unreported first.
    fn keep_retired(&mut self, policy: &MeshPolicy, ghost: HolderRecord) {
        match self.holders.binary_search_by_key(&ghost.node, |h| h.node) {
            Ok(i) => absorb(&mut self.holders[i], &ghost),
            Err(i) => {
                if policy.algorithm().counts_per_window()
                    && ghost.tally.granted == 0
                    && ghost.previous_held == 0
                {
                    return;
                }
                self.holders.insert(i, ghost);
            }
        }
        if policy.algorithm().is_bucket() {
            let mut retired = self.holders.iter().filter(|h| is_retired(h)).count();
            while retired > MAX_RETIRED {
                let Some(at) = self
                    .holders
                    .iter()
                    .position(|h| is_retired(h) && h.tally.unspent() == 0)
                else {
                    break;
                };
                self.holders.remove(at);
                retired -= 1;
            }
        }
    }

    /// Apply a holder's report (its cumulative counts and demand) at `now`; `alive`: whether
    /// the holder is a live member (a departed one's report, its last, only corrects its
    /// record). Return whether it told something the holder should see acknowledged
    /// (tokens given back, a final count).
    pub(crate) fn report(
        &mut self,
        policy: &MeshPolicy,
        now: Nanos,
        node: NodeId,
        incarnation: u64,
        want: &Want,
        alive: bool,
    ) -> bool {
        self.roll(policy, now);
        if policy.algorithm().is_bucket() {
            self.refill(policy, now);
        }
        if let Some(i) = self.live_index(node) {
            let h = self.holders[i];
            let newer = (h.incarnation, h.holding) > (incarnation, want.holding);
            if !alive && !newer {
                // Its last report goes to its holding's retired record.
                self.forget_holder_at(policy, i);
            } else if h.incarnation == incarnation && h.holding < want.holding {
                // A holding made afresh (the holder forgot the key while idle): the earlier
                // holding's record is retired and the new one counts from zero.
                self.forget_holder_at(policy, i);
                self.asked_mut(node).seq = 0;
            }
        }
        let ghost = retired_id(node, incarnation, want.holding);
        if let Ok(g) = self.holders.binary_search_by_key(&ghost, |h| h.node) {
            let newer_live = self.live_index(node).is_some_and(|i| {
                let h = &self.holders[i];
                (h.incarnation, h.holding) > (incarnation, want.holding)
            });
            if !alive || newer_live {
                // The holding is over: its report corrects its retired record.
                return self.apply_counts(policy, now, g, want, true);
            }
            // The holder lives on (it was counted dead, or its record came retired from
            // another state): its record is live again.
            self.revive(policy, g, node, incarnation);
        } else if !alive {
            return false;
        }
        let newest = {
            let asked = self.asked_mut(node);
            if want.smallest > 0 {
                asked.smallest = want.smallest;
            }
            let newest = want.seq >= asked.seq;
            asked.seq = asked.seq.max(want.seq);
            newest
        };
        if newest && want.need == 0 {
            // Its requests no longer wait (served, or denied at their deadline there): what
            // it holds may be recalled for others.
            self.waiting.retain(|w| w.node != node);
        }
        let known = self
            .live_index(node)
            .is_some_and(|i| self.holders[i].incarnation == incarnation);
        let r = self.record_mut(policy, node, incarnation);
        r.holding = r.holding.max(want.holding);
        r.demand = want.demand;
        let i = self.live_index(node).expect("made above");
        self.apply_counts(policy, now, i, want, known)
    }

    /// Make the retired record at `g` the live record of `node` (incarnation `incarnation`)
    /// again. A bucket holds its burst back again for what the holding was leased and did
    /// not report: those tokens never went back into the level, but while the holding was
    /// retired the level may have refilled into their room, which it gives up.
    fn revive(&mut self, policy: &MeshPolicy, g: usize, node: NodeId, incarnation: u64) {
        let ghost = self.holders.remove(g);
        if let Some(i) = self.live_index(node) {
            // An older holding of the node, live here: it is over.
            self.forget_holder_at(policy, i);
        }
        let at = self.holders.partition_point(|h| h.node < node);
        self.holders.insert(
            at,
            HolderRecord {
                node,
                incarnation,
                ..ghost
            },
        );
        if policy.algorithm().is_bucket() {
            let cap = policy
                .window_ns()
                .saturating_sub(self.outstanding().saturating_mul(self.interval(policy)));
            self.level_ns = self.level_ns.min(cap);
        }
    }

    /// Apply `want`'s counts to the record at `i` (`known`: the record already counted this
    /// holding before). Return whether it told something the holder should see
    /// acknowledged.
    fn apply_counts(
        &mut self,
        policy: &MeshPolicy,
        now: Nanos,
        i: usize,
        want: &Want,
        known: bool,
    ) -> bool {
        let algorithm = policy.algorithm();
        let window = self.window;
        let interval = self.interval(policy);
        let mut previous_correction = 0;
        let mut previous_raise = 0;
        let mut returned_tokens = 0;
        let mut granted_unseen = 0;
        let mut spent = 0;
        let mut news = false;
        {
            let r = &mut self.holders[i];
            if !algorithm.counts_per_window() || want.window == window {
                // A bucket taken over from a backup learns here of grants made after the
                // backup: those tokens left the bucket too (a window counts its holders'
                // grants, so the maximum below is enough there).
                if algorithm.is_bucket() && known && want.tally.granted > r.tally.granted {
                    granted_unseen = want.tally.granted - r.tally.granted;
                }
                // A holder this state has no record of (a fresh authority, or one taken
                // over from a backup made before the holder's first grant): what it gave
                // back went back into another state's bucket, and what it still holds is
                // out of this one.
                if algorithm.is_bucket() && !known {
                    granted_unseen = want.tally.unspent();
                    r.tally.returned = want.tally.returned;
                }
                // The holder's counts are authoritative for what it received and gave back:
                // a grant is always made on top of its latest report.
                returned_tokens = want.tally.returned.saturating_sub(r.tally.returned);
                if known {
                    spent = want.tally.used.saturating_sub(r.tally.used);
                }
                r.tally.merge(want.tally);
                if algorithm.counts_per_window() && want.closed && !r.closed {
                    r.closed = true;
                    news = true;
                }
            }
            // The holder's final count of the window before ours, if it knows it.
            let previous_final = if want.window + 1 == window && want.closed {
                Some(want.tally.used)
            } else if want.window == window {
                want.previous_used
            } else {
                None
            };
            if algorithm.counts_per_window() && !r.previous_final {
                match previous_final {
                    Some(final_used) => {
                        news = true;
                        // Exact, either way: below what it was leased here (it gave some
                        // back unspent), or above (it also spent a lease of another state
                        // of the key, one kept apart by a partition).
                        if final_used < r.previous_held {
                            previous_correction = r.previous_held - final_used;
                        } else {
                            previous_raise = final_used - r.previous_held;
                        }
                        r.previous_held = final_used;
                        r.previous_final = true;
                    }
                    None if want.window + 1 == window => {
                        // What it held then, as it reports it: an upper bound of its count.
                        let held = want.tally.granted.saturating_sub(want.tally.returned);
                        if held > r.previous_held {
                            previous_raise = held - r.previous_held;
                            r.previous_held = held;
                        }
                    }
                    None => {}
                }
            }
        }
        self.previous = self
            .previous
            .saturating_sub(previous_correction)
            .saturating_add(previous_raise);
        if granted_unseen > 0 {
            self.level_ns = self
                .level_ns
                .saturating_sub(granted_unseen.saturating_mul(interval));
        }
        if algorithm.is_bucket() && returned_tokens > 0 {
            self.level_ns = self
                .level_ns
                .saturating_add(returned_tokens.saturating_mul(interval))
                .min(policy.window_ns());
        }
        if algorithm.is_bucket() && spent > 0 {
            self.credit_spent(policy, now, spent, want.spent_ago);
            // A bucket's lease spent out: the holder waits to hear that it was counted.
            news |= self.holders[i].tally.unspent() == 0;
        }
        self.version += 1;
        news || returned_tokens > 0
    }

    /// Tell whether `node`'s record leaves nothing leased: a holder at rest, whose counts
    /// it waits to see confirmed before it forgets the key.
    pub(crate) fn at_rest(&self, node: NodeId) -> bool {
        self.live_index(node)
            .is_some_and(|i| self.holders[i].tally.unspent() == 0)
    }
}

fn blank(node: NodeId, incarnation: u64) -> HolderRecord {
    HolderRecord {
        node,
        incarnation,
        holding: 0,
        tally: Tally {
            granted: 0,
            returned: 0,
            used: 0,
        },
        demand: 0,
        previous_held: 0,
        previous_final: true,
        closed: false,
    }
}
