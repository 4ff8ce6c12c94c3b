//! Lockouts (`block_for`) on the mesh: kept by each key's authority in the node's
//! [`crate::mesh::locks::Locks`], told to the key's successor and next owner so that they
//! outlive the authority's node, and enforced on every answer the authority gives.
//!
//! Nodes learn of a lockout from the authority's denials (their retry time is the
//! lockout's end), and give their leases of the key back when it recalls them: until that
//! recall reaches a node (one trip), it may still admit from the lease it held, which the
//! limit counted already.

use super::Node;
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::{EXT_LOCKOUT, Ext, KeyRef, Lockout};
use crate::mesh::wire;

use super::owner::RECALL_GAP_NS;

impl Node {
    /// The lockout of mesh policy `policy` in ns (0: none).
    pub(super) fn lockout_of(&self, policy: u32) -> Nanos {
        self.config
            .lockouts
            .get(policy as usize)
            .copied()
            .unwrap_or(0)
    }

    /// How long `key` stays locked out at `now`, if it does.
    pub(super) fn locked(&self, key: &KeyRef, now: Nanos) -> Option<Nanos> {
        if self.lockout_of(key.policy) == 0 {
            return None;
        }
        self.locks.left(key, now)
    }

    /// The retry time of an answer about `key` at `now` that said `retry_after`: a denial
    /// (not 0) of a policy with a lockout starts one; during one, every answer denies until
    /// it ends.
    pub(super) fn lockout_retry(&mut self, now: Nanos, key: KeyRef, retry_after: Nanos) -> Nanos {
        let block = self.lockout_of(key.policy);
        if block == 0 {
            return retry_after;
        }
        if let Some(left) = self.locks.left(&key, now) {
            return retry_after.max(left);
        }
        if retry_after == 0 {
            return 0;
        }
        // A denial for the gap between two windows after a handover says nothing of the
        // key's use: no lockout.
        let policy = self.enforced(key);
        if self
            .authorities
            .get(&key)
            .is_some_and(|a| a.between_windows(&policy, now))
        {
            return retry_after;
        }
        let Some(left) = self.locks.lock(key, now, block) else {
            return retry_after;
        };
        self.stats.lockouts += 1;
        self.enforce_lockout(now, key);
        if let (_, Some(successor)) = self.membership.owner_and_successor(key.key) {
            self.tell_lockout(now, key, successor);
        }
        retry_after.max(left)
    }

    /// Make the authority of `key` kept here (if any) hold its lockout: deny whoever waits
    /// for room, and recall every lease.
    pub(super) fn enforce_lockout(&mut self, now: Nanos, key: KeyRef) {
        let policy = self.enforced(key);
        let Some(a) = self.authorities.get_mut(&key) else {
            return;
        };
        let waited = a.take_waiting();
        let recall = a.recall_all(now, RECALL_GAP_NS);
        for node in waited {
            let Some(a) = self.authorities.get_mut(&key) else {
                break;
            };
            let current = a.current(&policy, now, node);
            self.answer(now, key, node, current);
        }
        self.recall(now, key, recall);
    }

    /// Tell `to` (the key's successor) of `key`'s lockout, unless it was told already.
    pub(super) fn tell_lockout(&mut self, now: Nanos, key: KeyRef, to: NodeId) {
        if to == self.config.id {
            return;
        }
        if let Some(left) = self.locks.tell(&key, to, now) {
            self.send_lockout(key, to, left);
        }
    }

    /// Send `key`'s lockout, if it runs at `now`, to `to` (it takes the key's authority
    /// over, or restarted and keeps its backup).
    pub(super) fn hand_lockout(&mut self, now: Nanos, key: KeyRef, to: NodeId) {
        if let Some(left) = self.locked(&key, now)
            && to != self.config.id
        {
            self.send_lockout(key, to, left);
        }
    }

    fn send_lockout(&mut self, key: KeyRef, to: NodeId, left_ns: Nanos) {
        if let Ok(ext) = wire::encode_ext(EXT_LOCKOUT, &Lockout { key, left_ns }) {
            self.outbox.push_ext(to, ext);
        }
    }

    /// An extension item from a peer at `now` (a kind this build does not know is skipped).
    pub(super) fn on_ext(&mut self, now: Nanos, from: NodeId, ext: Ext) {
        if ext.kind != EXT_LOCKOUT {
            self.on_admin_ext(now, from, &ext);
            return;
        }
        let Ok(lockout) = wire::decode_ext::<Lockout>(&ext) else {
            return;
        };
        // A peer whose configuration differs may lock out longer, or under a policy with no
        // lockout here: this node's own `block_for` bounds it.
        let block = self.lockout_of(lockout.key.policy);
        if block == 0 {
            return;
        }
        let key = lockout.key;
        if self.locks.heard(key, now, lockout.left_ns.min(block)) {
            self.enforce_lockout(now, key);
        }
    }

    /// A round's share: after a change of the members, tell the successor of each key this
    /// node owns that is locked out (a new successor knows nothing of it); forget the
    /// lockouts that ended now and then.
    pub(super) fn lockout_rounds(&mut self, now: Nanos, round: u64) {
        if self.locks.len() == 0 {
            return;
        }
        let me = self.config.id;
        for key in self.locks.after_membership(self.membership.version(), now) {
            if let (owner, Some(successor)) = self.membership.owner_and_successor(key.key)
                && owner == me
            {
                self.tell_lockout(now, key, successor);
            }
        }
        if round.is_multiple_of(64) {
            self.locks.sweep(now);
        }
    }
}
