//! The keys a node uses: a holding per key (its lease, its waiting requests, its demand),
//! each numbered afresh when made, and each with its lease cell published in the node's
//! [`Cells`] for the request path for as long as the holding lives.

use std::sync::Arc;

use crate::mesh::cells::Cells;
use crate::mesh::holder::Holding;
use crate::mesh::keymap::FixedMap;
use crate::mesh::message::KeyRef;
use crate::policy::Policy;

/// A node's holdings.
#[derive(Debug)]
pub(super) struct Holdings {
    map: FixedMap<KeyRef, Holding>,
    /// The number the next holding of a key gets ([`crate::mesh::message::Want::holding`]):
    /// larger than any earlier holding's of the key on this run of the node.
    next_id: u64,
}

impl Default for Holdings {
    fn default() -> Self {
        Holdings {
            map: FixedMap::default(),
            next_id: 1,
        }
    }
}

impl Holdings {
    pub(super) fn get(&self, key: &KeyRef) -> Option<&Holding> {
        self.map.get(key)
    }

    pub(super) fn get_mut(&mut self, key: &KeyRef) -> Option<&mut Holding> {
        self.map.get_mut(key)
    }

    pub(super) fn contains_key(&self, key: &KeyRef) -> bool {
        self.map.contains_key(key)
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Return the keys held.
    pub(super) fn keys(&self) -> impl Iterator<Item = KeyRef> + '_ {
        self.map.keys().copied()
    }

    /// Return `key`'s holding, made now if the node holds nothing of the key (`policy`: the
    /// key's; `rounds`: the node's count of rounds), its cell published in `cells`.
    pub(super) fn get_or_make(
        &mut self,
        key: KeyRef,
        policy: &Policy,
        rounds: u64,
        cells: &Cells,
    ) -> &mut Holding {
        let next_id = &mut self.next_id;
        self.map.entry(key).or_insert_with(|| {
            let mut h = Holding::new(key, policy, *next_id);
            h.count_rounds_from(rounds);
            *next_id += 1;
            cells.insert(key, Arc::clone(h.cell()));
            h
        })
    }

    /// Forget `key`'s holding, and its cell in `cells`.
    pub(super) fn remove(&mut self, key: &KeyRef, cells: &Cells) {
        self.map.remove(key);
        cells.remove(key);
    }

    /// Call `f` with every holding of policy number `index` (every one with `None`).
    pub(super) fn for_each(&mut self, index: Option<u32>, mut f: impl FnMut(&mut Holding)) {
        for (key, h) in self.map.iter_mut() {
            if index.is_none_or(|i| key.policy == i) {
                f(h);
            }
        }
    }

    /// Give memory back when the map is mostly empty.
    pub(super) fn shrink(&mut self) {
        super::shrink_map(&mut self.map);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_key_made_again_is_a_new_holding_and_its_cell_lives_as_long_as_it() {
        let policy = Policy::fixed_window(10, Duration::from_secs(1)).unwrap();
        let cells = Cells::new(vec![policy], 100);
        let mut holdings = Holdings::default();
        let key = KeyRef { policy: 0, key: 7 };
        assert!(!cells.contains(0, 7));
        let first = holdings
            .get_or_make(key, &policy, 3, &cells)
            .want(0, 3, false, 1)
            .holding;
        // Made once: asked again, the same holding.
        let again = holdings
            .get_or_make(key, &policy, 3, &cells)
            .want(0, 3, false, 1)
            .holding;
        assert_eq!(first, again);
        assert!(cells.contains(0, 7));
        holdings.remove(&key, &cells);
        assert!(!cells.contains(0, 7) && holdings.get(&key).is_none());
        let second = holdings
            .get_or_make(key, &policy, 4, &cells)
            .want(0, 4, false, 1)
            .holding;
        assert!(second > first, "{second} after {first}");
        assert_eq!(holdings.len(), 1);
    }
}
