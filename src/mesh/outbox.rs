//! What a node has to say to each peer, packed into frames: small items into datagrams of at
//! most `max_datagram_bytes` (a lost one is harmless: every item is cumulative and sent
//! again while it matters), state transfers (handoffs, sync answers) into reliable frames
//! that travel on streams. Also the checks every frame from a peer passes before anything it
//! carries is applied.

use std::collections::BTreeMap;

use crate::mesh::NodeId;
use crate::mesh::lease::MAX_LEASE_TOKENS;
use crate::mesh::message::{
    AuthorityState, Frame, Header, Item, MAX_ADDR_BYTES, MAX_DEAD_LISTED, MAX_MEMBERS_PER_ITEM,
    MAX_POLICIES_ANNOUNCED, Member, PolicyLimits, Want,
};
use crate::mesh::wire::{self, MAX_FRAME_BYTES, WireError};
use crate::policy::{MAX_BUCKET_DEPTH_NS, Policy};

/// Bytes for one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The peer.
    pub to: NodeId,
    /// One frame.
    pub bytes: Vec<u8>,
    /// Send on a stream (state transfers) rather than as a datagram.
    pub reliable: bool,
}

/// Items waiting for the next flush, per peer.
#[derive(Debug, Default)]
pub struct Outbox {
    datagram: BTreeMap<NodeId, Vec<Item>>,
    reliable: BTreeMap<NodeId, Vec<Item>>,
}

/// The most holder records a state transfer may carry (a key used by every node of the
/// largest cluster).
pub const MAX_HOLDERS: usize = 1024;

/// The most items one frame may carry.
pub const MAX_ITEMS: usize = 4096;

impl Outbox {
    /// Queue `item` for `to` on a datagram.
    pub fn push(&mut self, to: NodeId, item: Item) {
        self.datagram.entry(to).or_default().push(item);
    }

    /// Queue a backup for `to`, replacing one of the same key among the last few queued
    /// (a newer state supersedes an older one).
    pub fn push_backup(&mut self, to: NodeId, state: AuthorityState) {
        let queue = self.datagram.entry(to).or_default();
        let recent = queue.len().saturating_sub(8);
        for item in &mut queue[recent..] {
            if let Item::Backup(old) = item
                && old.key == state.key
            {
                *old = state;
                return;
            }
        }
        queue.push(Item::Backup(state));
    }

    /// Queue `item` for `to` on a reliable frame.
    pub fn push_reliable(&mut self, to: NodeId, item: Item) {
        self.reliable.entry(to).or_default().push(item);
    }

    /// Tell whether anything waits for `to`.
    pub fn has(&self, to: NodeId) -> bool {
        self.datagram.contains_key(&to) || self.reliable.contains_key(&to)
    }

    /// Tell whether anything waits at all.
    pub fn is_empty(&self) -> bool {
        self.datagram.is_empty() && self.reliable.is_empty()
    }

    /// Pack everything into frames; `header` builds each frame's header for a peer.
    pub fn flush(
        &mut self,
        max_datagram_bytes: usize,
        mut header: impl FnMut(NodeId) -> Header,
        out: &mut Vec<Transmit>,
    ) {
        for (to, items) in std::mem::take(&mut self.reliable) {
            for frame in pack(header(to), items, MAX_FRAME_BYTES - 1) {
                if let Ok(bytes) = wire::encode(&frame) {
                    out.push(Transmit {
                        to,
                        bytes,
                        reliable: true,
                    });
                }
            }
        }
        for (to, items) in std::mem::take(&mut self.datagram) {
            let h = header(to);
            if items.is_empty() {
                if let Ok(bytes) = wire::encode(&Frame {
                    header: h,
                    items: Vec::new(),
                }) {
                    out.push(Transmit {
                        to,
                        bytes,
                        reliable: false,
                    });
                }
                continue;
            }
            for frame in pack(h, items, max_datagram_bytes.saturating_sub(1)) {
                if let Ok(bytes) = wire::encode(&frame) {
                    // An item too large for a datagram (a big backup) goes on a stream.
                    let reliable = bytes.len() > max_datagram_bytes;
                    out.push(Transmit {
                        to,
                        bytes,
                        reliable,
                    });
                }
            }
        }
    }

    /// Queue an empty frame (a heartbeat) for `to`, unless something else goes there.
    pub fn heartbeat(&mut self, to: NodeId) {
        self.datagram.entry(to).or_default();
    }
}

/// Split `items` into frames whose bodies stay within `budget` bytes (an item larger than
/// the budget gets a frame of its own).
fn pack(header: Header, items: Vec<Item>, budget: usize) -> Vec<Frame> {
    let base = wire::encoded_len(&Frame {
        header: header.clone(),
        items: Vec::new(),
    });
    let mut frames = Vec::new();
    let mut current: Vec<Item> = Vec::new();
    let mut size = base;
    for item in items {
        // An item's length, plus at most a few bytes more for the count prefix.
        let len = wire::encoded_len(&item) + 2;
        if !current.is_empty() && (size + len > budget || current.len() >= MAX_ITEMS) {
            frames.push(Frame {
                header: header.clone(),
                items: std::mem::take(&mut current),
            });
            size = base;
        }
        size += len;
        current.push(item);
    }
    if !current.is_empty() || frames.is_empty() {
        frames.push(Frame {
            header,
            items: current,
        });
    }
    frames
}

/// Why a frame from a peer was refused. Nothing it carried was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The bytes are not a frame.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The sender is not a member.
    #[error("frame from node {0}, which is not a member")]
    UnknownPeer(NodeId),
    /// A value out of range.
    #[error("{what}: {why}")]
    Invalid {
        /// Which field.
        what: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

fn invalid(what: &'static str, why: &'static str) -> FrameError {
    FrameError::Invalid { what, why }
}

/// Decode and check a frame against the cluster's `policies`.
pub fn decode(bytes: &[u8], policies: &[Policy]) -> Result<Frame, FrameError> {
    let frame: Frame = wire::decode(bytes)?;
    if frame.header.incarnation == 0 {
        return Err(invalid("header.incarnation", "is 0"));
    }
    if frame.items.len() > MAX_ITEMS {
        return Err(invalid("items", "too many in one frame"));
    }
    if frame
        .header
        .dead
        .as_ref()
        .is_some_and(|d| d.len() > MAX_DEAD_LISTED)
    {
        return Err(invalid("header.dead", "lists too many members"));
    }
    for item in &frame.items {
        check_item(item, policies)?;
    }
    Ok(frame)
}

fn policy_of(policies: &[Policy], index: u32) -> Result<&Policy, FrameError> {
    policies
        .get(index as usize)
        .ok_or_else(|| invalid("key.policy", "no such mesh policy"))
}

/// The most tokens any count may reach: a bucket's counts grow for ever, but never faster
/// than one token per ns.
const MAX_COUNT: u64 = 1 << 62;

fn check_want(w: &Want, policies: &[Policy]) -> Result<(), FrameError> {
    policy_of(policies, w.key.policy)?;
    if w.granted > MAX_COUNT || w.returned > w.granted || w.used > w.granted {
        return Err(invalid("want", "counts out of range"));
    }
    // A peer's limit may differ from this node's while a change rolls out: bounded by the
    // largest lease any policy allows, not by this node's limit.
    if w.need > MAX_LEASE_TOKENS.saturating_mul(MAX_ITEMS as u64) {
        return Err(invalid("want.need", "larger than any request could need"));
    }
    if w.previous_used.is_some_and(|u| u > MAX_COUNT) {
        return Err(invalid("want.previous_used", "out of range"));
    }
    Ok(())
}

fn check_state(s: &AuthorityState, policies: &[Policy]) -> Result<(), FrameError> {
    policy_of(policies, s.key.policy)?;
    if s.holders.len() > MAX_HOLDERS {
        return Err(invalid("state.holders", "too many"));
    }
    // A bucket's level is at most its depth; the sender's bucket may be deeper than this
    // node's while a change rolls out (the receiver caps it at its own depth).
    if s.level_ns > MAX_BUCKET_DEPTH_NS {
        return Err(invalid("state.level_ns", "above any bucket's depth"));
    }
    for h in &s.holders {
        if h.granted > MAX_COUNT || h.returned > h.granted || h.used > h.granted {
            return Err(invalid("state.holders", "counts out of range"));
        }
    }
    Ok(())
}

fn check_members(members: &[Member]) -> Result<(), FrameError> {
    if members.len() > MAX_MEMBERS_PER_ITEM {
        return Err(invalid("members", "too many in one item"));
    }
    for m in members {
        if m.addr.len() > MAX_ADDR_BYTES {
            return Err(invalid("members.addr", "too long"));
        }
    }
    Ok(())
}

fn check_limits(limits: &[PolicyLimits]) -> Result<(), FrameError> {
    if limits.len() > MAX_POLICIES_ANNOUNCED {
        return Err(invalid("limits", "too many policies"));
    }
    for l in limits {
        if l.capacity == 0 || l.capacity > MAX_LEASE_TOKENS {
            return Err(invalid("limits.capacity", "out of range"));
        }
        if l.interval_ns == 0 || l.window_ns == 0 || l.window_ns > MAX_BUCKET_DEPTH_NS {
            return Err(invalid("limits.window_ns", "out of range"));
        }
    }
    Ok(())
}

fn check_item(item: &Item, policies: &[Policy]) -> Result<(), FrameError> {
    match item {
        Item::Want(w) => check_want(w, policies),
        Item::Grant(g) => {
            policy_of(policies, g.key.policy)?;
            if g.granted > MAX_COUNT {
                return Err(invalid("grant.granted", "out of range"));
            }
            Ok(())
        }
        Item::Recall { key, .. } | Item::NotOwner(key) => {
            policy_of(policies, key.policy).map(|_| ())
        }
        Item::Backup(s) | Item::Handoff(s) | Item::Restore(s) => check_state(s, policies),
        Item::SyncDone => Ok(()),
        Item::Count(c) => policy_of(policies, c.key.policy).map(|_| ()),
        Item::Members(m) => check_members(m),
        Item::Limits(l) => check_limits(l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::message::{Grant, KeyRef};

    fn grant(key: u64) -> Item {
        Item::Grant(Grant {
            key: KeyRef { policy: 0, key },
            window: 1 << 40,
            granted: 1 << 30,
            ends_at: 1 << 60,
            retry_after: 0,
            more_coming: 0,
            answers: 0,
            holding: 1 << 40,
        })
    }

    #[test]
    fn datagrams_stay_under_the_limit() {
        let mut outbox = Outbox::default();
        for k in 0..500 {
            outbox.push(2, grant(u64::MAX - k));
        }
        let mut out = Vec::new();
        outbox.flush(
            1150,
            |_| Header {
                incarnation: 1,
                sent_at: u64::MAX >> 1,
                ..Header::default()
            },
            &mut out,
        );
        assert!(out.len() > 10);
        assert!(out.iter().all(|t| t.bytes.len() <= 1150 && !t.reliable));
        let policies =
            [crate::Policy::fixed_window(10, std::time::Duration::from_secs(1)).unwrap()];
        let items: usize = out
            .iter()
            .map(|t| decode(&t.bytes, &policies).unwrap().items.len())
            .sum();
        assert_eq!(items, 500);
    }
}
