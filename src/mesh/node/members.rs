//! How a node spreads what it knows of the members: news to every live peer each round
//! (`Membership::news`), suspicions passed on to the suspect, and the whole list to a
//! starting peer (with its sync answer) and to one peer in turn every [`LIST_EVERY`] rounds.

use super::Node;
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::{Item, MAX_MEMBERS_PER_ITEM, Member};

/// Every this many rounds, one live peer in turn gets the whole list of members.
pub(super) const LIST_EVERY: u64 = 100;

impl Node {
    /// Take in a list of members from peer `from`.
    pub(super) fn on_members(&mut self, now: Nanos, from: NodeId, members: &[Member]) {
        let heard = self.membership.hear_members(now, from, members);
        for (to, member) in heard.relay {
            self.outbox.push(to, Item::Members(vec![member]));
        }
        self.apply_changes(now, &heard.changes);
        // A list of members names its sender (news about others do not).
        if members.iter().any(|m| m.id == from) {
            self.join_listed(now, from);
        }
    }

    /// Once a round: the news to every live peer, and now and then the whole list to one.
    pub(super) fn spread_members(&mut self, round: u64) {
        let news = self.membership.news();
        let list_due = round.is_multiple_of(LIST_EVERY);
        if news.is_empty() && !list_due {
            return;
        }
        let peers: Vec<NodeId> = self
            .membership
            .peers()
            .iter()
            .filter(|(_, p)| p.alive)
            .map(|(&id, _)| id)
            .collect();
        if peers.is_empty() {
            return;
        }
        for &p in &peers {
            for chunk in news.chunks(MAX_MEMBERS_PER_ITEM) {
                self.outbox.push(p, Item::Members(chunk.to_vec()));
            }
        }
        if list_due {
            let to = peers[(round / LIST_EVERY) as usize % peers.len()];
            self.send_members(to, false);
        }
    }

    /// Queue the whole list of members for `to` (on a reliable frame, for a sync answer).
    pub(super) fn send_members(&mut self, to: NodeId, reliable: bool) {
        let list = self.membership.list();
        for chunk in list.chunks(MAX_MEMBERS_PER_ITEM) {
            let item = Item::Members(chunk.to_vec());
            if reliable {
                self.outbox.push_reliable(to, item);
            } else {
                self.outbox.push(to, item);
            }
        }
    }
}
