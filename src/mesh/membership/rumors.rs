//! What members tell each other about members: the dissemination half of the membership.
//!
//! A node tells every live peer, for a few rounds (`NEWS_ROUNDS`), what changed in its
//! view: a member that reached it, one it suspects, declared dead or saw leave, and its own
//! refutation of a suspicion. A starting peer gets the whole list (with its sync answer), and
//! one peer in turn gets it now and then. What a node makes of what it is told:
//!
//! - a member it did not know is *pending* (the transport reaches it; it counts once heard);
//! - a suspicion of this node is refuted: its liveness counter goes above the suspicion's
//!   and the members are told (they pass the refutation on, so it reaches a member that
//!   cannot hear this node directly); a suspicion of another member is passed on to it;
//! - a refutation (a higher liveness counter) clears the suspicion of a live member;
//! - a member told left, with the incarnation this node knows, has left; a pending member
//!   told dead or gone is forgotten. A death is never taken from others: each node declares
//!   its own, with a majority (the authorities' safety rests on it).

use super::{Change, MAX_MEMBERS, Membership, Peer, addr_from_wire, addr_to_wire};
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::{Member, MemberState};

/// Rounds during which a piece of news goes to every live peer.
pub(super) const NEWS_ROUNDS: u8 = 3;

/// What a list of members from a peer changed, and what to pass on.
#[derive(Debug, Default)]
pub(crate) struct Heard {
    /// The membership changes.
    pub changes: Vec<Change>,
    /// Suspicions of other members, to pass on to them (so they can refute).
    pub relay: Vec<(NodeId, Member)>,
}

impl Membership {
    /// Tell every live peer about `member` for the next `NEWS_ROUNDS` rounds (replacing
    /// older news of the same member).
    pub(crate) fn tell(&mut self, member: Member) {
        self.news.retain(|(m, _)| m.id != member.id);
        self.news.push((member, NEWS_ROUNDS));
    }

    /// Tell every live peer that peer `id` is in `state`.
    pub(crate) fn tell_state(&mut self, id: NodeId, state: MemberState) {
        if let Some(p) = self.peers.get(&id) {
            let member = describe(id, p, state);
            self.tell(member);
        }
    }

    /// Return the news to send every live peer this round (each piece goes out for
    /// `NEWS_ROUNDS` rounds).
    pub(crate) fn news(&mut self) -> Vec<Member> {
        let out = self.news.iter().map(|(m, _)| m.clone()).collect();
        for (_, left) in &mut self.news {
            *left -= 1;
        }
        self.news.retain(|(_, left)| *left > 0);
        out
    }

    /// Return every member this node knows of and how it sees them, itself included
    /// (pending ones are left out: this node has not heard them).
    pub(crate) fn list(&self) -> Vec<Member> {
        let me = Member {
            id: self.me,
            incarnation: self.incarnation,
            seq: self.seq,
            state: if self.leaving {
                MemberState::Left
            } else {
                MemberState::Alive
            },
            addr: Vec::new(),
        };
        std::iter::once(me)
            .chain(
                self.peers
                    .iter()
                    .filter(|(_, p)| !p.pending)
                    .map(|(&id, p)| {
                        let state = if p.left {
                            MemberState::Left
                        } else if !p.alive {
                            MemberState::Dead
                        } else if p.suspect_since.is_some() {
                            MemberState::Suspect
                        } else {
                            MemberState::Alive
                        };
                        describe(id, p, state)
                    }),
            )
            .collect()
    }

    /// Forget peer `id` (it was pending and is gone, or gone for long).
    fn forget(&mut self, id: NodeId, changes: &mut Vec<Change>) {
        self.peers.remove(&id);
        changes.push(Change::Forgotten(id));
    }

    /// Take in what peer `from` told at `now` about `members`.
    pub(crate) fn hear_members(&mut self, now: Nanos, from: NodeId, members: &[Member]) -> Heard {
        let mut heard = Heard::default();
        for m in members {
            if m.id == self.me {
                self.about_me(m);
            } else if !self.peers.contains_key(&m.id) {
                self.learn(now, m, &mut heard.changes);
            } else {
                self.about_peer(now, from, m, &mut heard);
            }
        }
        if !heard.changes.is_empty() {
            self.reindex();
        }
        heard
    }

    /// A member says something about this node: refute a suspicion (or a death, or a leave
    /// it did not make) of this incarnation by raising the liveness counter above it.
    fn about_me(&mut self, m: &Member) {
        let this_life = m.incarnation == 0 || m.incarnation == self.incarnation;
        let doubted = match m.state {
            MemberState::Alive => false,
            MemberState::Left => !self.leaving,
            MemberState::Suspect | MemberState::Dead => true,
        };
        if this_life && doubted && m.seq >= self.seq {
            self.seq = m.seq.saturating_add(1);
            let me = Member {
                id: self.me,
                incarnation: self.incarnation,
                seq: self.seq,
                state: MemberState::Alive,
                addr: Vec::new(),
            };
            self.tell(me);
        }
    }

    /// A member names one this node does not know: pending, to be reached.
    fn learn(&mut self, now: Nanos, m: &Member, changes: &mut Vec<Change>) {
        let named_alive = matches!(m.state, MemberState::Alive | MemberState::Suspect);
        // Ids above the largest node id name departed holders' records, never a member.
        if !named_alive || m.id > crate::ids::MAX_NODE_ID || self.peers.len() + 1 >= MAX_MEMBERS {
            return;
        }
        self.peers.insert(
            m.id,
            Peer {
                pending: true,
                seq: m.seq,
                since: now,
                heard_at: 0,
                addr: addr_from_wire(&m.addr),
                ..Peer::default()
            },
        );
        changes.push(Change::Learned(m.id));
    }

    /// A member says something about a peer this node knows.
    fn about_peer(&mut self, now: Nanos, from: NodeId, m: &Member, heard: &mut Heard) {
        let peer = self.peers.get_mut(&m.id).expect("known");
        if peer.addr.is_none() {
            peer.addr = addr_from_wire(&m.addr);
        }
        if peer.pending {
            match m.state {
                MemberState::Dead | MemberState::Left => self.forget(m.id, &mut heard.changes),
                MemberState::Alive | MemberState::Suspect => peer.seq = peer.seq.max(m.seq),
            }
            return;
        }
        // About another life of the peer than the one this node heard: its own frames will
        // tell.
        if m.incarnation != 0 && peer.incarnation.is_some_and(|i| i != m.incarnation) {
            return;
        }
        if peer.left {
            return;
        }
        match m.state {
            MemberState::Alive => {
                if m.seq > peer.seq {
                    peer.seq = m.seq;
                    if peer.alive {
                        // A refutation: it is alive, if not to this node's ears.
                        peer.suspect_since = None;
                        peer.vouched_at = now;
                    }
                    // Pass it on: it may not have reached every member.
                    let mut passed = m.clone();
                    if passed.addr.is_empty() {
                        passed.addr = addr_to_wire(peer.addr);
                    }
                    self.tell(passed);
                }
            }
            MemberState::Suspect => {
                if peer.alive && from != m.id && m.seq >= peer.seq {
                    heard.relay.push((m.id, m.clone()));
                }
            }
            MemberState::Left => {
                // The life that left: the one this node heard, or, if it never heard the
                // peer (it started after the peer left), the one the others name; should
                // the peer come back, its own frames tell.
                if m.incarnation != 0 && peer.incarnation.is_none_or(|i| i == m.incarnation) {
                    peer.incarnation = Some(m.incarnation);
                    peer.left = true;
                    peer.suspect_since = None;
                    peer.since = now;
                    if peer.alive {
                        peer.alive = false;
                        self.version += 1;
                    }
                    heard.changes.push(Change::Left(m.id));
                    self.tell_state(m.id, MemberState::Left);
                }
            }
            MemberState::Dead => {}
        }
    }
}

/// Describe peer `id` as being in `state`.
fn describe(id: NodeId, p: &Peer, state: MemberState) -> Member {
    Member {
        id,
        incarnation: p.incarnation.unwrap_or(0),
        seq: p.seq,
        state,
        addr: addr_to_wire(p.addr),
    }
}
