//! Snapshots of long-lived counts, for a restart of every node at once (a full redeploy, a
//! power cut): the embedding program asks the node now and then for what changed
//! ([`Node::snapshot_changes`]) and keeps it on disk; after a restart it hands it back
//! ([`Node::restore_saved`]) before the node serves.
//!
//! What is saved: the authorities this node keeps and the backups it holds of its peers'
//! (as owner and as successor), of policies whose window (or a bucket's time to fill from
//! empty) is an hour or more, and every running lockout. A saved state is used only where
//! the live cluster has none: when this node becomes a key's owner and neither a backup, a
//! handoff nor a restore from its peers gave it the key's authority (it would start afresh
//! otherwise). Its times are on this machine's clock (UNIX ns), read back with the error
//! of one gossip round. A saved state whose authority would be idle by now is dropped.

use std::collections::HashMap;

use super::Node;
use crate::clock::Nanos;
use crate::mesh::authority::Authority;
use crate::mesh::message::{AuthorityState, KeyRef};
use crate::mesh::timing::Offset;
use crate::mesh::windows::MeshPolicy;
use crate::mesh::wire;
use crate::policy::Policy;

/// Windows (and buckets' times to fill) this long or longer are saved.
pub(crate) const LONG_WINDOW_NS: Nanos = 3600 * 1_000_000_000;

/// One key as saved: its authority's state and its lockout, or (`bytes: None`) that the
/// node keeps nothing of it any more (drop what was saved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedKey {
    /// The mesh policy's number.
    pub policy: u32,
    /// The key.
    pub key: u64,
    /// The saved state (opaque; `None`: nothing to keep).
    pub bytes: Option<Vec<u8>>,
}

/// What is saved of one key.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
struct Saved {
    state: Option<AuthorityState>,
    /// When its lockout ends (UNIX ns; 0: none).
    lockout_until: u64,
}

/// What the node saved and read back.
#[derive(Debug, Default)]
pub(super) struct Snapshots {
    /// The version (and lockout end) of each key last handed out.
    saved: HashMap<KeyRef, (u64, Nanos)>,
    /// States read back at start, used where the cluster has none.
    restored: HashMap<KeyRef, AuthorityState>,
}

fn is_long(policy: &Policy) -> bool {
    policy.window_ns() >= LONG_WINDOW_NS
}

impl Node {
    /// What changed since the last call among the keys worth saving (see the module's
    /// docs), and the keys no longer kept. Costs a pass over the node's authorities and
    /// backups.
    pub fn snapshot_changes(&mut self, now: Nanos) -> Vec<SavedKey> {
        let mut current: HashMap<KeyRef, (u64, Nanos, Option<AuthorityState>)> = HashMap::new();
        for (key, a) in self.authorities.iter() {
            if self.limits.of_key(key).is_some_and(|p| is_long(&p)) {
                let state = a.state();
                current.insert(*key, (state.version, 0, Some(state)));
            }
        }
        for key in self
            .backups
            .keys_where(|k, _| self.limits.of_key(k).is_some_and(|p| is_long(&p)))
        {
            if current.contains_key(&key) {
                continue;
            }
            if let Some(b) = self.backups.get(&key) {
                current.insert(key, (b.state.version, 0, Some(b.state.clone())));
            }
        }
        for key in self.locks.running(now) {
            let until = self.locks.until(&key).unwrap_or(0);
            current
                .entry(key)
                .and_modify(|c| c.1 = until)
                .or_insert((0, until, None));
        }
        let mut out = Vec::new();
        for (key, (version, until, state)) in current.iter() {
            if self.snapshots.saved.get(key) == Some(&(*version, *until)) {
                continue;
            }
            let saved = Saved {
                state: state.clone(),
                lockout_until: *until,
            };
            if let Ok(bytes) = wire::encode_saved(&saved) {
                out.push(SavedKey {
                    policy: key.policy,
                    key: key.key,
                    bytes: Some(bytes),
                });
                self.snapshots.saved.insert(*key, (*version, *until));
            }
        }
        let gone: Vec<KeyRef> = self
            .snapshots
            .saved
            .keys()
            .filter(|k| !current.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            self.snapshots.saved.remove(&key);
            out.push(SavedKey {
                policy: key.policy,
                key: key.key,
                bytes: None,
            });
        }
        out
    }

    /// Take back what was saved before a restart, at `now` (before the node serves): the
    /// states wait for a key this node comes to own without its authority; lockouts run
    /// again. Entries that do not read, name a policy the node does not have, or would be
    /// idle by now are skipped; return how many were taken.
    pub fn restore_saved(&mut self, saved: Vec<SavedKey>, now: Nanos) -> usize {
        let own = Offset {
            offset: 0,
            error: self.config.gossip_interval_ns,
            round_trip: 0,
        };
        let mut taken = 0;
        for s in saved {
            let Some(bytes) = s.bytes else { continue };
            let key = KeyRef {
                policy: s.policy,
                key: s.key,
            };
            let Some(policy) = self.limits.of_key(&key) else {
                continue;
            };
            let Ok(saved) = wire::decode_saved::<Saved>(&bytes) else {
                continue;
            };
            if saved.lockout_until > now && self.lockout_of(key.policy) > 0 {
                let left = (saved.lockout_until - now).min(self.lockout_of(key.policy));
                self.locks.heard(key, now, left);
                taken += 1;
            }
            let Some(state) = saved.state else { continue };
            let valid = state.key == key
                && wire::check::check_state(&state, self.limits.enforced()).is_ok();
            if valid && !Authority::state_is_idle(&state, &policy, own, now) {
                self.snapshots.restored.insert(key, state);
                taken += 1;
            }
        }
        taken
    }

    /// Whether a state saved before the restart waits for `key`.
    pub(super) fn snapshots_hold(&self, key: &KeyRef) -> bool {
        self.snapshots.restored.contains_key(key)
    }

    /// The saved state of `key`, if one was read back and the cluster gave none: taken
    /// (once) by a new authority of the key.
    pub(super) fn take_restored(
        &mut self,
        key: &KeyRef,
        policy: &MeshPolicy,
        now: Nanos,
    ) -> Option<Authority> {
        let state = self.snapshots.restored.remove(key)?;
        let own = Offset {
            offset: 0,
            error: self.config.gossip_interval_ns,
            round_trip: 0,
        };
        let mut a = Authority::from_state(&state, policy, own, now);
        let membership = &self.membership;
        a.retire_departed(policy, |node, run| membership.is_live_run(node, run));
        self.stats.snapshots_restored += 1;
        Some(a)
    }

    /// Forget read-back states that are idle by `now` (the cluster's own use of the key
    /// outlived them).
    pub(super) fn sweep_restored(&mut self, now: Nanos) {
        if self.snapshots.restored.is_empty() {
            return;
        }
        let own = Offset {
            offset: 0,
            error: self.config.gossip_interval_ns,
            round_trip: 0,
        };
        let limits = &self.limits;
        self.snapshots.restored.retain(|key, state| {
            limits
                .of_key(key)
                .is_some_and(|p| !Authority::state_is_idle(state, &p, own, now))
        });
    }
}
