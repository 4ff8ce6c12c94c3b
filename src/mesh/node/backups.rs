//! The backups a node keeps of its peers' authorities, as the successor of their keys:
//! the newest state each owner sent, which the node takes over if the owner dies, and
//! which it drops once it would be an idle authority or the key is no longer its to back.

use crate::mesh::NodeId;
use crate::mesh::keymap::FixedMap;
use crate::mesh::membership::{Membership, RankMemo};
use crate::mesh::message::{AuthorityState, KeyRef};

/// A backup of a peer's authority.
#[derive(Debug)]
pub(super) struct Backup {
    /// The peer that sent it (the key's owner).
    pub(super) from: NodeId,
    pub(super) state: AuthorityState,
    /// A reset the owner told of: its window and the tokens it forgave
    /// ([`crate::mesh::authority::Authority::forgive`] on a takeover).
    pub(super) reset: Option<(u64, u64)>,
    /// The key's owner and successor, as last ranked.
    rank: RankMemo,
}

/// The backups a node keeps.
#[derive(Debug, Default)]
pub(super) struct Backups {
    map: FixedMap<KeyRef, Backup>,
}

impl Backups {
    /// Keep the backup `from` sent of its authority: it replaces an older state of the same
    /// owner, or any state of another (the key's owner changed).
    pub(super) fn keep(&mut self, from: NodeId, state: AuthorityState) {
        match self.map.entry(state.key) {
            std::collections::hash_map::Entry::Occupied(mut kept) => {
                // The key's kept ranking stays: it is checked against the membership before
                // each use.
                let b = kept.get_mut();
                if b.from != from || b.state.version <= state.version {
                    if b.from != from {
                        b.reset = None;
                    }
                    b.from = from;
                    b.state = state;
                }
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Backup {
                    from,
                    state,
                    reset: None,
                    rank: RankMemo::default(),
                });
            }
        }
    }

    /// The owner of `key` reset it in `window`, forgiving `forgiven` tokens.
    pub(super) fn forgive(&mut self, key: &KeyRef, window: u64, forgiven: u64) {
        if let Some(b) = self.map.get_mut(key) {
            b.reset = Some((window, forgiven));
        }
    }

    pub(super) fn get(&self, key: &KeyRef) -> Option<&Backup> {
        self.map.get(key)
    }

    pub(super) fn remove(&mut self, key: &KeyRef) -> Option<Backup> {
        self.map.remove(key)
    }

    /// Return the keys whose backups `pick` selects.
    pub(super) fn keys_where(&self, mut pick: impl FnMut(&KeyRef, &Backup) -> bool) -> Vec<KeyRef> {
        self.map
            .iter()
            .filter(|(k, b)| pick(k, b))
            .map(|(&k, _)| k)
            .collect()
    }

    /// Return the states `pick` selects.
    pub(super) fn states_where(
        &self,
        mut pick: impl FnMut(&KeyRef, &Backup) -> bool,
    ) -> Vec<AuthorityState> {
        self.map
            .iter()
            .filter(|(k, b)| pick(k, b))
            .map(|(_, b)| b.state.clone())
            .collect()
    }

    /// Drop the backups of keys that are no longer this node's (`me`) to back up: kept
    /// while their owner lives and this node is the key's successor, or while this node
    /// owns the key.
    pub(super) fn keep_own(&mut self, me: NodeId, membership: &Membership) {
        self.map.retain(|k, b| {
            let (owner, successor) = membership.owner_and_successor_in(k.key, &b.rank);
            (membership.is_alive(b.from) && successor == Some(me)) || owner == me
        });
    }

    /// Give memory back when the map is mostly empty.
    pub(super) fn shrink(&mut self) {
        super::shrink_map(&mut self.map);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(key: u64, version: u64) -> AuthorityState {
        AuthorityState {
            key: KeyRef { policy: 0, key },
            version,
            window: 0,
            ends_at: 0,
            next_at: 0,
            previous: 0,
            level_ns: 0,
            level_at: 0,
            holders: Vec::new(),
        }
    }

    #[test]
    fn a_backup_keeps_its_owners_newest_state_or_a_new_owners_any() {
        let mut backups = Backups::default();
        let key = KeyRef { policy: 0, key: 7 };
        backups.keep(2, state(7, 5));
        backups.keep(2, state(7, 3));
        assert_eq!(backups.get(&key).map(|b| b.state.version), Some(5));
        backups.keep(2, state(7, 6));
        assert_eq!(backups.get(&key).map(|b| b.state.version), Some(6));
        // Another owner's, even older: the key changed hands.
        backups.keep(3, state(7, 1));
        let b = backups.get(&key).unwrap();
        assert_eq!((b.from, b.state.version), (3, 1));
        backups.keep(2, state(8, 1));
        assert_eq!(
            backups.keys_where(|_, b| b.from == 2),
            vec![KeyRef { policy: 0, key: 8 }]
        );
        assert_eq!(backups.states_where(|_, b| b.from == 3).len(), 1);
        assert!(backups.remove(&key).is_some() && backups.get(&key).is_none());
    }
}
