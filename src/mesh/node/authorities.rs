//! The authorities a node keeps (the keys it owns, or takes over), and which of them
//! changed since their last backup: a changed authority is listed once, and each round
//! sends the backups of those listed, in key order.

use crate::mesh::NodeId;
use crate::mesh::authority::Authority;
use crate::mesh::keymap::FixedMap;
use crate::mesh::message::KeyRef;
use crate::mesh::windows::MeshPolicy;
use crate::policy::Policy;

/// A node's authorities, and the ones whose backup is due.
#[derive(Debug, Default)]
pub(super) struct Authorities {
    map: FixedMap<KeyRef, Authority>,
    /// Authorities changed since their last backup (each flagged too:
    /// [`Authority::mark_dirty`]), listed once until the round sends them.
    changed: Vec<KeyRef>,
}

impl Authorities {
    pub(super) fn get(&self, key: &KeyRef) -> Option<&Authority> {
        self.map.get(key)
    }

    pub(super) fn get_mut(&mut self, key: &KeyRef) -> Option<&mut Authority> {
        self.map.get_mut(key)
    }

    pub(super) fn contains_key(&self, key: &KeyRef) -> bool {
        self.map.contains_key(key)
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&KeyRef, &Authority)> {
        self.map.iter()
    }

    /// Tell whether `key`'s authority has requests waiting: every look at it may find room
    /// for them (a sliding window's previous count fades continuously), so any timer of the
    /// key is live.
    pub(super) fn has_waiters(&self, key: KeyRef) -> bool {
        self.map.get(&key).is_some_and(Authority::has_waiters)
    }

    /// Return the keys of the authorities kept.
    pub(super) fn keys(&self) -> impl Iterator<Item = KeyRef> + '_ {
        self.map.keys().copied()
    }

    /// Keep `authority` for `key` (replacing any other) and return it.
    pub(super) fn insert(&mut self, key: KeyRef, authority: Authority) -> &mut Authority {
        self.map.insert(key, authority);
        self.map.get_mut(&key).expect("inserted")
    }

    /// Keep `incoming` for `key`, or merge it into the authority kept (`policy`: the key's).
    pub(super) fn merge_in(
        &mut self,
        key: KeyRef,
        incoming: Authority,
        policy: &MeshPolicy,
    ) -> &mut Authority {
        match self.map.entry(key) {
            std::collections::hash_map::Entry::Occupied(kept) => {
                let a = kept.into_mut();
                a.merge(policy, &incoming);
                a
            }
            std::collections::hash_map::Entry::Vacant(slot) => slot.insert(incoming),
        }
    }

    pub(super) fn remove(&mut self, key: &KeyRef) -> Option<Authority> {
        self.map.remove(key)
    }

    /// Note that `key`'s authority changed since its last backup.
    pub(super) fn changed(&mut self, key: KeyRef) {
        if let Some(a) = self.map.get_mut(&key)
            && a.mark_dirty()
        {
            self.changed.push(key);
        }
    }

    /// Call `backup` with each authority changed since its last backup, in key order, once
    /// each, and count it backed up.
    pub(super) fn backups(&mut self, mut backup: impl FnMut(KeyRef, &mut Authority)) {
        let mut changed = std::mem::take(&mut self.changed);
        // A key listed twice (its authority dropped and made again) once.
        changed.sort_unstable();
        changed.dedup();
        for &key in &changed {
            if let Some(a) = self.map.get_mut(&key)
                && a.take_dirty()
            {
                backup(key, a);
            }
        }
        changed.clear();
        self.changed = changed;
    }

    /// The limits of policy number `index` changed from `old` to `new`.
    pub(super) fn limits_changed(
        &mut self,
        index: u32,
        old: &Policy,
        new: &Policy,
        overrides: &std::collections::HashMap<KeyRef, u64>,
    ) {
        for (key, a) in self.map.iter_mut() {
            // A key with an override keeps its own limit; a bucket's rate follows its
            // policy's only through the override's scaling.
            if key.policy == index {
                match overrides.get(key) {
                    Some(&limit) => {
                        let (Ok(o), Ok(n)) = (old.with_limit(limit), new.with_limit(limit)) else {
                            continue;
                        };
                        a.limits_changed(&o, &n);
                    }
                    None => a.limits_changed(old, new),
                }
                if a.mark_dirty() {
                    self.changed.push(*key);
                }
            }
        }
    }

    /// Forget what `node` held of every key (it died, left or restarted); `policy_of`: the
    /// policy each key is enforced with.
    pub(super) fn forget_holder(
        &mut self,
        policy_of: impl Fn(&KeyRef) -> Option<MeshPolicy>,
        node: NodeId,
    ) {
        for (key, a) in self.map.iter_mut() {
            if let Some(policy) = policy_of(key) {
                a.forget_holder(&policy, node);
            }
        }
    }

    /// Drop the authorities `idle` says hold nothing worth keeping; return their keys.
    pub(super) fn drop_idle(
        &mut self,
        mut idle: impl FnMut(&KeyRef, &mut Authority) -> bool,
    ) -> Vec<KeyRef> {
        let keys: Vec<KeyRef> = self
            .map
            .iter_mut()
            .filter_map(|(k, a)| idle(k, a).then_some(*k))
            .collect();
        for key in &keys {
            self.map.remove(key);
        }
        keys
    }

    /// Give memory back when the map is mostly empty.
    pub(super) fn shrink(&mut self) {
        super::shrink_map(&mut self.map);
        if self.changed.capacity() > 1024 {
            self.changed.shrink_to(1024);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn keys(n: u64) -> Vec<KeyRef> {
        (1..=n)
            .map(|key| KeyRef {
                policy: (key % 2) as u32,
                key,
            })
            .collect()
    }

    #[test]
    fn each_changed_authority_is_backed_up_once_in_key_order() {
        let policy = MeshPolicy::from(Policy::fixed_window(10, Duration::from_secs(1)).unwrap());
        let mut authorities = Authorities::default();
        for key in keys(6) {
            authorities.insert(key, Authority::fresh(key, &policy, 0));
        }
        for key in [5, 2, 5, 4, 9].map(|key| KeyRef {
            policy: (key % 2) as u32,
            key,
        }) {
            authorities.changed(key);
        }
        // Key 4 dropped and made afresh: once, as the new one.
        let four = KeyRef { policy: 0, key: 4 };
        authorities.remove(&four);
        authorities.insert(four, Authority::fresh(four, &policy, 0));
        authorities.changed(four);
        let mut sent = Vec::new();
        authorities.backups(|key, _| sent.push(key.key));
        assert_eq!(sent, vec![2, 4, 5]);
        // Nothing changed since: nothing to send.
        authorities.backups(|key, _| sent.push(key.key));
        assert_eq!(sent.len(), 3);
        // A change of policy 1's limits changes its authorities only.
        let raised = Policy::fixed_window(20, Duration::from_secs(1)).unwrap();
        authorities.limits_changed(1, &policy, &raised, &Default::default());
        authorities.backups(|key, _| sent.push(key.key));
        assert_eq!(sent[3..], [1, 3, 5]);
        let dropped = authorities.drop_idle(|key, _| key.key > 4);
        assert_eq!(dropped.len(), 2);
        assert_eq!(authorities.len(), 4);
    }
}
