//! Questions one node asks another for the admin API, on streams as extension items: a
//! key's state and its reset, which the key's owner answers itself from its authority, and
//! questions of the program that embeds the node (kinds from [`ASK_APP`] on: its local
//! counters, its heavy hitters, its overrides), handed to it by [`Node::poll_admin`] and
//! answered with [`Node::reply`]. The node keeps no state for a question it asked: the
//! caller matches a reply's id and gives up when it waits too long.
//!
//! A reset of a mesh key: its authority forgives what the current window counted beyond
//! what holders still hold (`mesh::authority::reset`), drops the key's lockout, recalls its
//! leases, and tells every live member, which drop the lockout and the denial they keep of
//! it (the successor also notes the forgiveness with its backup, for a takeover in the same
//! window). A new owner by handoff does not learn of it: it counts the window as before the
//! reset (fewer tokens, never more).

use std::collections::VecDeque;

use bincode::{Decode, Encode};

use super::Node;
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::{Ask, EXT_ASK, EXT_REPLY, EXT_RESET, Ext, KeyRef, Reply, Reset};
use crate::mesh::wire;

/// [`Node::ask_owner`]: a key's state as its owner's authority sees it ([`KeyView`]).
pub const ASK_KEY: u32 = 1;
/// [`Node::ask_owner`]: reset a key, answered with its state after ([`KeyView`]).
pub const ASK_RESET: u32 = 2;
/// The first kind of question the embedding program defines (the mesh hands it over).
pub const ASK_APP: u32 = 1 << 16;

/// The most questions and answers waiting for [`Node::poll_admin`]; more are dropped.
const MAX_WAITING: usize = 1024;

/// A question for the program that embeds the node, or an answer to one it asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminMessage {
    /// A peer (or this node) asks: answer with [`Node::reply`] to `from` with `id`.
    Asked {
        /// Who asks.
        from: NodeId,
        /// Its number for the question.
        id: u64,
        /// What is asked (from [`ASK_APP`] on).
        kind: u32,
        /// The question.
        body: Vec<u8>,
    },
    /// The answer to a question this node asked ([`Node::ask_peer`], [`Node::ask_owner`]).
    Answered {
        /// Who answers.
        from: NodeId,
        /// The question's number.
        id: u64,
        /// The answer (empty: not understood; for [`ASK_KEY`] and [`ASK_RESET`], a
        /// [`KeyView`] to decode with [`KeyView::decode`]).
        body: Vec<u8>,
    },
}

/// A mesh key as its owner's authority sees it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct KeyView {
    /// The node that answered (the key's owner in its own view).
    pub owner: NodeId,
    /// Whether it keeps state of the key (else the key is fresh: its whole limit).
    pub known: bool,
    /// The policy's limit (bucket: its burst).
    pub limit: u64,
    /// Tokens the owner can grant now.
    pub available: u64,
    /// Tokens leased to nodes and not reported spent: they may still be admitted.
    pub leased: u64,
    /// Tokens reported spent in the current window (buckets: by the current leases).
    pub used: u64,
    /// Nanoseconds until the count starts afresh (the window's end; a bucket full again).
    pub reset_after_ns: u64,
    /// The current window's index (0: a bucket).
    pub window: u64,
    /// Nanoseconds the key's lockout (`block_for`) still lasts (0: none).
    pub lockout_ns: u64,
    /// The nodes holding a lease of the key: `(node, unspent, reported spent)`.
    pub holders: Vec<(NodeId, u64, u64)>,
}

impl KeyView {
    /// Decode an answer's body.
    pub fn decode(body: &[u8]) -> Option<KeyView> {
        let config = bincode::config::standard().with_limit::<{ 64 * 1024 }>();
        match bincode::decode_from_slice::<KeyView, _>(body, config) {
            Ok((view, used)) if used == body.len() => Some(view),
            _ => None,
        }
    }
}

/// The questions and answers that wait for the embedding program.
#[derive(Debug, Default)]
pub(super) struct AdminQueue {
    waiting: VecDeque<AdminMessage>,
    next_id: u64,
    /// Dropped because too many waited.
    pub(super) dropped: u64,
}

impl AdminQueue {
    fn push(&mut self, message: AdminMessage) {
        if self.waiting.len() >= MAX_WAITING {
            self.dropped += 1;
            return;
        }
        self.waiting.push_back(message);
    }
}

impl Node {
    /// Ask `to` (a member, or this node) question `kind` (from [`ASK_APP`] on) with `body`
    /// at most 16 KiB: return its number, which [`AdminMessage::Answered`] names; `None`
    /// if the question is too long.
    pub fn ask_peer(&mut self, to: NodeId, kind: u32, body: Vec<u8>) -> Option<u64> {
        self.admin.next_id += 1;
        let id = self.admin.next_id;
        if to == self.config.id {
            self.admin.push(AdminMessage::Asked {
                from: to,
                id,
                kind,
                body,
            });
            return Some(id);
        }
        let ext = wire::encode_ext(EXT_ASK, &Ask { id, kind, body }).ok()?;
        self.outbox.push_ext(to, ext);
        Some(id)
    }

    /// Ask the owner of `key` of mesh policy `policy` for its state ([`ASK_KEY`]) or to
    /// reset it ([`ASK_RESET`]) at `now`: return the question's number and the owner asked
    /// (this node's view of it); `None` for a policy the node does not have.
    pub fn ask_owner(
        &mut self,
        now: Nanos,
        policy: u32,
        key: u64,
        kind: u32,
    ) -> Option<(u64, NodeId)> {
        self.policy(policy)?;
        let key = KeyRef { policy, key };
        let (owner, _) = self.membership.owner_and_successor(key.key);
        self.admin.next_id += 1;
        let id = self.admin.next_id;
        if owner == self.config.id {
            let body = self.key_answer(now, kind, key);
            self.admin.push(AdminMessage::Answered {
                from: owner,
                id,
                body,
            });
            return Some((id, owner));
        }
        let body = wire::encode_saved(&key).ok()?;
        let ext = wire::encode_ext(EXT_ASK, &Ask { id, kind, body }).ok()?;
        self.outbox.push_ext(owner, ext);
        Some((id, owner))
    }

    /// Answer question `id` of `to` (an [`AdminMessage::Asked`]) with `body` (at most
    /// 16 KiB; a longer one is answered empty).
    pub fn reply(&mut self, to: NodeId, id: u64, body: Vec<u8>) {
        if to == self.config.id {
            self.admin
                .push(AdminMessage::Answered { from: to, id, body });
            return;
        }
        let ext = wire::encode_ext(EXT_REPLY, &Reply { id, body }).or_else(|_| {
            wire::encode_ext(
                EXT_REPLY,
                &Reply {
                    id,
                    body: Vec::new(),
                },
            )
        });
        if let Ok(ext) = ext {
            self.outbox.push_ext(to, ext);
        }
    }

    /// The next question or answer for the embedding program.
    pub fn poll_admin(&mut self) -> Option<AdminMessage> {
        self.admin.waiting.pop_front()
    }

    /// An admin extension item from `from` at `now`.
    pub(super) fn on_admin_ext(&mut self, now: Nanos, from: NodeId, ext: &Ext) {
        match ext.kind {
            EXT_ASK => {
                let Ok(ask) = wire::decode_ext::<Ask>(ext) else {
                    return;
                };
                if ask.kind >= ASK_APP {
                    self.admin.push(AdminMessage::Asked {
                        from,
                        id: ask.id,
                        kind: ask.kind,
                        body: ask.body,
                    });
                    return;
                }
                let body = match wire::decode_saved::<KeyRef>(&ask.body) {
                    Ok(key) => self.key_answer(now, ask.kind, key),
                    Err(_) => Vec::new(),
                };
                self.reply(from, ask.id, body);
            }
            EXT_REPLY => {
                if let Ok(reply) = wire::decode_ext::<Reply>(ext) {
                    self.admin.push(AdminMessage::Answered {
                        from,
                        id: reply.id,
                        body: reply.body,
                    });
                }
            }
            EXT_RESET => {
                if let Ok(reset) = wire::decode_ext::<Reset>(ext) {
                    self.heard_reset(reset);
                }
            }
            _ => {}
        }
    }

    /// The answer to a question about `key` ([`ASK_KEY`], [`ASK_RESET`]), empty for a
    /// policy the node does not have or a kind it does not know.
    fn key_answer(&mut self, now: Nanos, kind: u32, key: KeyRef) -> Vec<u8> {
        if self.policy(key.policy).is_none() || !matches!(kind, ASK_KEY | ASK_RESET) {
            return Vec::new();
        }
        if kind == ASK_RESET {
            self.reset_key(now, key);
        }
        let view = self.key_view(now, key);
        wire::encode_saved(&view).unwrap_or_default()
    }

    /// What this node's authority of `key` says of it at `now`.
    fn key_view(&mut self, now: Nanos, key: KeyRef) -> KeyView {
        let policy = self.enforced(key);
        let lockout_ns = self.locked(&key, now).unwrap_or(0);
        let owner = self.config.id;
        match self.authorities.get_mut(&key) {
            Some(a) => {
                let v = a.view(&policy, now);
                KeyView {
                    owner,
                    known: true,
                    limit: policy.capacity(),
                    available: v.available,
                    leased: v.leased,
                    used: v.used,
                    reset_after_ns: v.reset_after,
                    window: v.window,
                    lockout_ns,
                    holders: v.holders,
                }
            }
            None => KeyView {
                owner,
                known: false,
                limit: policy.capacity(),
                available: policy.capacity(),
                leased: 0,
                used: 0,
                reset_after_ns: 0,
                window: 0,
                lockout_ns,
                holders: Vec::new(),
            },
        }
    }

    /// Reset `key` at `now` as its owner: see the module's docs.
    fn reset_key(&mut self, now: Nanos, key: KeyRef) {
        self.stats.resets += 1;
        let policy = self.enforced(key);
        let (window, forgiven, recall) = match self.authorities.get_mut(&key) {
            Some(a) => {
                let (window, forgiven) = a.reset(&policy, now);
                (window, forgiven, a.recall_all(now, 0))
            }
            None => (0, 0, Vec::new()),
        };
        let reset = Reset {
            key,
            window,
            forgiven,
        };
        self.heard_reset(reset);
        self.recall(now, key, recall);
        self.serve_waiting(key, now);
        if let Ok(ext) = wire::encode_ext(EXT_RESET, &reset) {
            let membership = &self.membership;
            let live: Vec<NodeId> = membership
                .peers()
                .keys()
                .copied()
                .filter(|&p| p != self.config.id && membership.is_alive(p))
                .collect();
            for peer in live {
                self.outbox.push_ext(peer, ext.clone());
            }
        }
    }

    /// A reset of `key`: its lockout ends, this node's holding asks afresh, and a backup of
    /// the key remembers what it forgave.
    fn heard_reset(&mut self, reset: Reset) {
        let key = reset.key;
        self.locks.clear(&key);
        if let Some(h) = self.holdings.get_mut(&key) {
            h.forget_denial();
        }
        self.backups.forgive(&key, reset.window, reset.forgiven);
        self.schedule.touch(key);
    }
}
