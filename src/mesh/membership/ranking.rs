//! Rendezvous ranking: which live members own a key (the highest weight first, then its
//! successor), whether a peer's view agrees that this node owns one, and the dead members
//! that ranked above it.

use std::cell::Cell;

use super::Membership;
use crate::clock::Nanos;
use crate::mesh::NodeId;

/// How many keys' rankings a membership keeps (a power of two; 48 bytes each). A key's
/// ranking is asked for several times per request across the rounds that follow it; with
/// 64 members it costs 64 hashes to compute again.
pub(super) const RANK_CACHE: usize = 4096;

/// The members of highest rendezvous weight for a key, among the live members of one
/// version: what ranking, owning and agreeing read of the top three.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ranking {
    key: u64,
    live_version: u64,
    /// The first two (this node's id where fewer were found).
    top: [NodeId; 2],
    /// The third's weight (meaningful when three were found).
    third: u64,
    /// How many of the top three are members (3 stands for 3 or more).
    found: u8,
}

impl Ranking {
    /// A ranking that matches no key's (its version is never a live one).
    pub(super) const NONE: Ranking = Ranking {
        key: 0,
        live_version: u64::MAX,
        top: [0; 2],
        third: 0,
        found: 0,
    };
}

/// A key's ranking kept with the key's own state (its holding, authority or backup): asked
/// for again among the same live members, it costs neither the 64 hashes nor a look into
/// the shared cache, whose slot is most often cold by then. Only the membership that
/// filled it may read it.
#[derive(Debug, Clone)]
pub(crate) struct RankMemo(Cell<Ranking>);

impl Default for RankMemo {
    fn default() -> Self {
        RankMemo(Cell::new(Ranking::NONE))
    }
}

impl Membership {
    /// The ranking of `key` kept in `memo` if it was made among the current live members;
    /// made (and kept there) otherwise.
    fn ranking_in(&self, key: u64, memo: Option<&RankMemo>) -> Ranking {
        let Some(memo) = memo else {
            return self.ranking(key);
        };
        let kept = memo.0.get();
        if kept.key == key && kept.live_version == self.live_version {
            return kept;
        }
        let r = self.ranking(key);
        memo.0.set(r);
        r
    }

    /// The three live members of highest weight for `key` (ties keep the earlier listed).
    fn ranking(&self, key: u64) -> Ranking {
        let slot = &self.rank_cache[(key as usize) & (RANK_CACHE - 1)];
        let cached = slot.get();
        if cached.key == key && cached.live_version == self.live_version {
            return cached;
        }
        let mut top: [(u64, NodeId); 3] = [(0, self.me); 3];
        let mut found = 0u8;
        for &(pre, id) in &self.live {
            let w = mix(key ^ pre);
            // Most members rank below the third: one comparison for them.
            if found == 3 && w <= top[2].0 {
                continue;
            }
            if found == 0 || w > top[0].0 {
                top[2] = top[1];
                top[1] = top[0];
                top[0] = (w, id);
            } else if found == 1 || w > top[1].0 {
                top[2] = top[1];
                top[1] = (w, id);
            } else if found == 2 || w > top[2].0 {
                top[2] = (w, id);
            }
            found = (found + 1).min(3);
        }
        let r = Ranking {
            key,
            live_version: self.live_version,
            top: [top[0].1, top[1].1],
            third: top[2].0,
            found,
        };
        slot.set(r);
        r
    }

    /// Tell whether peer `id`, by the view its newest frame told, ranks this node first for
    /// `key` and itself second: it counts this node alive, and every other member it counts
    /// alive ranks below both. Unknown views do not agree.
    ///
    /// Second, not just below: a successor whose view changes may rank another member first
    /// while the owner it confirmed before still holds its lease. That is safe only when the
    /// earlier owner is gone from the successor's view (declared dead, so its lease ran out
    /// first, or left): were it still alive there, it would rank between the new owner and
    /// the successor, which then is not second.
    ///
    /// `memo`, if given, is the key's kept ranking ([`RankMemo`]).
    pub(crate) fn agrees_i_own(&self, id: NodeId, key: u64, memo: Option<&RankMemo>) -> bool {
        let Some(dead) = self.peers.get(&id).and_then(|p| p.their_dead.as_ref()) else {
            return false;
        };
        if dead.contains(&self.me) {
            return false;
        }
        let mine = weight(key, self.me);
        let theirs = weight(key, id);
        if theirs >= mine {
            return false;
        }
        // This node ranks itself first and `id` second, every other live member below `id`:
        // only the members it does not count alive remain to be looked at.
        let r = self.ranking_in(key, memo);
        if r.top[0] == self.me && r.top[1] == id && (r.found < 3 || r.third < theirs) {
            return self
                .dormant
                .iter()
                .all(|&(pre, peer)| peer == id || mix(key ^ pre) < theirs || dead.contains(&peer));
        }
        // Every peer that did not leave: the live ones (this node aside) and the dormant ones.
        self.live
            .iter()
            .chain(&self.dormant)
            .filter(|&&(_, peer)| peer != self.me)
            .all(|&(pre, peer)| peer == id || mix(key ^ pre) < theirs || dead.contains(&peer))
    }

    /// Return the members this node declared dead (and that did not come back or leave) that
    /// rank above it for `key`, with the local time of each declaration: the owners the key
    /// may have had before this node.
    pub(crate) fn dead_above(&self, key: u64) -> impl Iterator<Item = (NodeId, Nanos)> + '_ {
        let mine = weight(key, self.me);
        // The dead are among the dormant (the peers neither alive nor gone).
        self.dormant
            .iter()
            .filter(move |&&(pre, _)| mix(key ^ pre) > mine)
            .filter_map(|&(_, id)| {
                let p = self.peers.get(&id)?;
                (!p.alive && !p.left && !p.pending && p.deaths > 0).then_some((id, p.since))
            })
    }

    /// Return the key's owner and successor (if there is a second live member).
    pub(crate) fn owner_and_successor(&self, key: u64) -> (NodeId, Option<NodeId>) {
        owner_and_successor_of(self.me, self.ranking(key))
    }

    /// [`Membership::owner_and_successor`], read from or kept in the key's `memo`.
    pub(crate) fn owner_and_successor_in(
        &self,
        key: u64,
        memo: &RankMemo,
    ) -> (NodeId, Option<NodeId>) {
        owner_and_successor_of(self.me, self.ranking_in(key, Some(memo)))
    }
}

fn owner_and_successor_of(me: NodeId, r: Ranking) -> (NodeId, Option<NodeId>) {
    let owner = if r.found >= 1 { r.top[0] } else { me };
    (owner, (r.found >= 2).then_some(r.top[1]))
}

/// The rendezvous weight of member `id` for `key`.
pub fn weight(key: u64, id: NodeId) -> u64 {
    mix(key ^ premix(id))
}

/// The half of a rendezvous weight that depends on the member alone.
pub(super) fn premix(id: NodeId) -> u64 {
    mix(id.wrapping_add(0x9e37_79b9_7f4a_7c15))
}

/// A 64-bit finalizer (splitmix64's): spreads every input bit over the output.
pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
